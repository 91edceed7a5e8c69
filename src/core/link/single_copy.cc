#include "core/link/single_copy.h"

#include <atomic>
#include <string>
#include <thread>

#include "castmesh/config.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process_memory.h"

namespace castmesh::link {
namespace {

std::atomic<bool> refused{false};
std::atomic<uint64_t> copied_bytes{0};  // read by read_process_memory (single_copy_bytes())

// Large single copies run as two halves on two threads: the kernel's copy
// (it pins each page first) runs well below memcpy on one core.
constexpr size_t kSplitCopyBytes = size_t{16} << 20;

}  // namespace

bool single_copy_usable() { return !refused.load(std::memory_order_relaxed); }

void note_single_copy_refused(const absl::Status& why) {
  if (!refused.exchange(true)) {
    CASTMESH_LOG_INFO("castmesh-link: the kernel refused a cross-memory copy ({}); large messages between procs "
                      "of this host go through shared-memory rings or the transport, RDMA buffers through a "
                      "shared segment or the transport, from now on",
                      std::string(why.message()));
  }
}

bool single_copy_enabled() {
  static const bool on = CASTMESH_LINUX_FACILITIES && config::global().single_copy;
  return on && single_copy_usable();
}

bool single_copy_towards(const ProcId& peer) { return single_copy_enabled() && platform::proc_on_this_host(peer); }

absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size) {
  absl::Status read = platform::read_process_memory(pid, address, out, size);
  if (absl::IsPermissionDenied(read) || absl::IsUnimplemented(read)) note_single_copy_refused(read);
  if (read.ok()) copied_bytes.fetch_add(size, std::memory_order_relaxed);
  return read;
}

absl::Status copy_between(int64_t pid, uint64_t address, char* local, size_t length, bool write) {
  auto copy = [pid, write](uint64_t remote, char* mine, size_t n) {
    return write ? platform::write_process_memory(pid, remote, mine, n)
                 : platform::read_process_memory(pid, remote, mine, n);
  };
  if (length < kSplitCopyBytes) return copy(address, local, length);
  const size_t half = length / 2;
  absl::Status second;
  std::thread helper([&] { second = copy(address + half, local + half, length - half); });
  absl::Status first = copy(address, local, half);
  helper.join();
  return first.ok() ? second : first;
}

uint64_t single_copy_bytes() { return copied_bytes.load(std::memory_order_relaxed); }

}  // namespace castmesh::link
