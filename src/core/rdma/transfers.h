// The requester side of RDMA buffers: operations this process started on
// buffers of other procs, from the first message to their one completion.
//
// A Transfer completes exactly once: with its result, its error, a timeout,
// or the loss of the owner proc. Bytes reach a read's destination only
// under the transfer's lock and only before it completed, so a destination
// is never written after its operation reported a failure.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/rdma.h"
#include "core/scheduler/timer_queue.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::rdma {

struct SegmentWindow;

// One operation on another proc's buffer.
struct Transfer {
  uint64_t id = 0;
  ProcId owner;
  uint64_t buffer = 0;  // the owner's registration id
  bool write = false;
  bool release = false;  // a RELEASE request, not a data operation
  uint64_t offset = 0;   // in the owner's buffer
  size_t length = 0;
  TensorView local;      // read: destination, write: source (kept alive)
  char* bytes = nullptr;  // local.data()
  RdmaTransport transport = RdmaTransport::kSocket;
  int64_t owner_pid = 0;  // the handle's pid: a lease must name this process
  bool segment_offered = false;  // the owner offers a shared segment (single copy's fallback)
  uint64_t remote_address = 0;  // ibverbs: the owner's NIC address of the buffer's first byte
  uint32_t rkey = 0;            // ibverbs: the owner's remote key
  // Same host: try a one-sided copy (one_sided.h) before `transport`, with the handle's slot.
  bool one_sided = false;
  uint32_t one_sided_slot = 0;
  uint64_t one_sided_generation = 0;
  std::weak_ptr<proc::ProcHost> host;  // the proc that sends
  std::function<void(absl::StatusOr<RdmaResult>)> done;  // called once, by Transfers::finish

  // Shared segment: the staging window, set (under mu) before the first
  // message goes and never reset, so handlers of the answers read it freely.
  std::shared_ptr<SegmentWindow> window;

  detail::Mutex mu;
  size_t moved ABSL_GUARDED_BY(mu) = 0;
  bool finished ABSL_GUARDED_BY(mu) = false;
  // Run once by Transfers::finish, outside the lock, before `done`
  // (argument: whether the operation succeeded).
  std::function<void(bool ok)> cleanup ABSL_GUARDED_BY(mu);
  uint64_t timer = 0;  // set by Transfers::start
};

class Transfers {
 public:
  // The process's table (leaked: I/O threads may use it during exit).
  static Transfers& instance();

  // A fresh operation number.
  uint64_t next_id();
  // Tracks `transfer` until it finishes; fails it after `timeout`.
  void start(const std::shared_ptr<Transfer>& transfer, absl::Duration timeout);
  // The unfinished transfer `id`, or nullptr.
  std::shared_ptr<Transfer> find(uint64_t id);
  // Completes `transfer` with `result` unless it already completed.
  void finish(const std::shared_ptr<Transfer>& transfer, absl::StatusOr<RdmaResult> result);
  // Copies bytes the owner sent for [offset, offset+size) into a read's
  // destination; finishes the read once every byte is there.
  void deliver(const std::shared_ptr<Transfer>& transfer, uint64_t offset, const char* body, size_t size);
  // Runs `copy` (a single copy into or out of the owner's memory) under the
  // transfer's lock, unless it already completed: then false, nothing ran.
  bool copy_if_live(const std::shared_ptr<Transfer>& transfer, const std::function<absl::Status()>& copy,
                    absl::Status* copied);
  // Fails every transfer to `owner` (its proc was lost).
  void owner_lost(const ProcId& owner, const absl::Status& why);

 private:
  detail::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> live_ ABSL_GUARDED_BY(mu_);
  detail::TimerQueue timers_;
};

}  // namespace castmesh::rdma
