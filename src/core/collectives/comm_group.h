// CommGroup: one rank's view of a communicator: who the ranks are and where
// they live, this rank's mailbox, the collective sequence counter, and the
// primitives every algorithm is built from (send bytes to a rank, post a
// receive from a rank, abort a collective everywhere). Shared by every
// Communicator handle of that rank.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "castmesh/communicator.h"
#include "castmesh/runtime.h"
#include "core/collectives/rank_mailbox.h"
#include "core/collectives/request_state.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::detail {

class CommGroup : public std::enable_shared_from_this<CommGroup> {
 public:
  // Where the ranks live: procs[r] is rank r's proc; `self_proc` is this
  // process's proc id (ranks there are reached by a memory copy); `host` the
  // proc's transport (may be null when every rank lives here).
  struct Layout {
    std::string id;
    std::string description;  // "communicator of mesh 'worker'"
    int rank = 0;
    Shape shape;
    std::vector<ProcId> procs;
    ProcId self_proc;
    std::weak_ptr<proc::ProcHost> host;
  };
  // The group of (layout.id, layout.rank) in this process: the live one or
  // a new one (kept alive by the process when `pin`).
  static std::shared_ptr<CommGroup> Get(Layout layout, bool pin);
  ~CommGroup();

  int rank() const { return layout_.rank; }
  int size() const { return static_cast<int>(layout_.procs.size()); }
  const std::string& id() const { return layout_.id; }
  const Shape& shape() const { return layout_.shape; }
  const Layout& layout() const { return layout_; }
  collectives::RankMailbox& mailbox() { return *mailbox_; }

  // Sends `size` bytes to rank `dest` (eager: the bytes are copied or
  // written out before this returns).
  absl::Status send(collectives::Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                    const std::string& signature = {}, uint64_t sequence = 0);
  // Posts a receive of at most `capacity` bytes into `buffer`.
  std::shared_ptr<RequestState> post_recv(collectives::Channel channel, int source, int64_t tag, void* buffer,
                                          size_t capacity, std::string signature = {});
  // A fresh collective sequence number (the same on every rank for the
  // n-th collective it calls).
  uint64_t next_sequence() { return next_sequence_.fetch_add(1, std::memory_order_relaxed); }
  // Collective `sequence` failed here: fail it on every rank.
  void abort(uint64_t sequence, const absl::Status& why);
  // Runs `op` on a thread of its own; the request completes with its result.
  Request run_async(std::function<absl::Status()> op);

  explicit CommGroup(Layout layout);

 private:
  Layout layout_;
  std::shared_ptr<collectives::RankMailbox> mailbox_;
  std::atomic<uint64_t> next_sequence_{1};
};

}  // namespace castmesh::detail
