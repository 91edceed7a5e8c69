#include "core/platform/core_contention.h"

#include <sys/resource.h>

#include "core/platform/platform.h"

namespace castmesh::platform {

uint64_t involuntary_switches() {
  struct rusage usage {};
#if CASTMESH_LINUX_FACILITIES
  const int who = RUSAGE_THREAD;
#else
  const int who = RUSAGE_SELF;  // coarser: any thread of the process preempted
#endif
  if (::getrusage(who, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_nivcsw);
}

uint64_t CoreContention::switches_since_last() {
  const uint64_t now = involuntary_switches();
  const uint64_t since = started_ && now > last_ ? now - last_ : 0;
  last_ = now;
  started_ = true;
  return since;
}

}  // namespace castmesh::platform
