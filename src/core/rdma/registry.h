// The owner side of RDMA buffers: the memory this process registered, and
// the pins other procs hold on it while they copy.
//
// A Registration lives in the registry from register_memory() until
// release(); every operation in flight holds its own reference, so the
// registered view (and whatever owns its memory) stays alive until the last
// operation on it has finished, whenever the release came.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/rdma.h"

namespace castmesh::rdma {

// Callbacks that run when the Registration holding them is destroyed, i.e.
// when no transport uses its memory any more (release() waits for that).
class FreedCallbacks {
 public:
  FreedCallbacks() = default;
  FreedCallbacks(const FreedCallbacks&) = delete;
  FreedCallbacks& operator=(const FreedCallbacks&) = delete;
  // Runs the callbacks (on the thread that dropped the last reference).
  ~FreedCallbacks();
  // Adds `callback`; any thread.
  void add(std::function<void()> callback) const;

 private:
  mutable detail::Mutex mu_;
  mutable std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// One registered buffer. Immutable once made (but for `freed`).
struct Registration {
  // Declared first, so it runs after `nic` and `view` have let go of the memory.
  FreedCallbacks freed;
  uint64_t id = 0;
  TensorView view;  // keeps the memory alive
  char* base = nullptr;
  size_t size = 0;
  RdmaAccess access = RdmaAccess::kReadWrite;
  ProcId owner;
  // The NIC registration of the range (ibverbs), or nullptr; declared after
  // `view` so it deregisters before the memory can go.
  std::shared_ptr<void> nic;
  uint64_t nic_address = 0;
  uint32_t rkey = 0;
};

// The facts an operation is checked against before any byte moves: kOutOfRange
// for [offset, offset+length) past `size`, kPermissionDenied when `access`
// lacks the direction. `what` names the buffer in messages.
absl::Status check_operation(const std::string& what, size_t size, RdmaAccess access, bool write, uint64_t offset,
                             uint64_t length);

// Runs `done` once `registration` (just released) is destroyed: at once
// when the caller holds the last reference, else on a thread of its own
// when the last holder drops it (that holder may be inside any lock).
void when_freed(std::shared_ptr<const Registration> registration, std::function<void()> done);

class Registry {
 public:
  // The process's registry (leaked: I/O threads may use it during exit).
  static Registry& instance();

  // Registers `view` (already validated) for `owner`; `nic` (may be null)
  // is its NIC registration (rkey), kept as long as the registration lives.
  std::shared_ptr<const Registration> add(TensorView view, RdmaAccess access, ProcId owner,
                                          std::shared_ptr<void> nic = nullptr, uint32_t rkey = 0);
  // The live registration `id`, checked for one operation. kFailedPrecondition
  // when it was released or never registered here.
  absl::StatusOr<std::shared_ptr<const Registration>> open(uint64_t id, bool write, uint64_t offset,
                                                           uint64_t length);
  // Takes `id` out of service: later open()s fail. Returns the registration
  // (nullptr when it was not live); operations in flight keep their own
  // references, and the caller decides how long the NIC part must outlive it
  // (IbverbsPath::retire).
  std::shared_ptr<const Registration> release(uint64_t id);

  // Pins `registration` while proc `peer` copies for its operation `op`.
  void pin(const ProcId& peer, uint64_t op, std::shared_ptr<const Registration> registration);
  // The copy of (`peer`, `op`) is over.
  void unpin(const ProcId& peer, uint64_t op);
  // Proc `peer` is gone: drops its pins.
  void forget_peer(const ProcId& peer);

 private:
  detail::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const Registration>> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<ProcId, uint64_t>, std::shared_ptr<const Registration>> pins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::rdma
