// Whether another thread wants the calling thread's core: the signal a
// spinning waiter uses to decide between pausing (cheap, keeps the core) and
// yielding it (a system call of several microseconds on a VM, worth it only
// when some thread is queued for this core).
//
// The signal is the calling thread's own involuntary context switches (Linux
// counts a preemption, and a sched_yield that handed the core to another
// thread, as involuntary; sleeping is voluntary). It rises only when a thread
// was actually queued behind this one, so a host whose runnable threads are
// this job's own spinners reads as uncontended, unlike /proc/loadavg's
// runnable count. Where the per-thread count is missing (not Linux, or a
// CASTMESH_POSIX_FALLBACKS build) the process's count is used.
#pragma once

#include <cstdint>

namespace castmesh::platform {

// The calling thread's involuntary context switches so far (the process's
// where a per-thread count is missing); 0 if the system reports none.
uint64_t involuntary_switches();

// One thread's view of contention for its core. Not thread-safe: one per
// thread (e.g. thread_local).
class CoreContention {
 public:
  // How many times the thread was switched off its core involuntarily
  // since the previous call (0 on the first call). One system call.
  uint64_t switches_since_last();

 private:
  uint64_t last_ = 0;
  bool started_ = false;
};

}  // namespace castmesh::platform
