#include "core/collectives/single_copy.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "castmesh/config.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process.h"
#include "core/platform/process_memory.h"

namespace castmesh::collectives {
namespace {

std::atomic<bool> refused{false};
std::atomic<uint64_t> copied_bytes{0};  // read by single copy (single_copy_bytes())

bool enabled() {
  static const bool on = CASTMESH_LINUX_FACILITIES && config::global().single_copy;
  return on && !refused.load(std::memory_order_relaxed);
}

void stop_offering(const std::string& why) {  // Linux only
  if (!refused.exchange(true)) {
    CASTMESH_LOG_INFO("castmesh-collectives: same-host single copy refused by the kernel ({}); large messages "
                      "between processes of this host go through the transport instead",
                      why);
  }
}

}  // namespace

bool single_copy_towards(const ProcId& peer) { return enabled() && platform::proc_on_this_host(peer); }

absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size) {
  absl::Status read = platform::read_process_memory(pid, address, out, size);
  if (absl::IsPermissionDenied(read) || absl::IsUnimplemented(read)) stop_offering(std::string(read.message()));
  if (read.ok()) copied_bytes.fetch_add(size, std::memory_order_relaxed);
  return read;
}

uint64_t single_copy_bytes() { return copied_bytes.load(std::memory_order_relaxed); }

}  // namespace castmesh::collectives
