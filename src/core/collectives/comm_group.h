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
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/rank_mailbox.h"
#include "core/progress/request_state.h"
#include "core/collectives/scratch_pool.h"

namespace castmesh::proc {
class ProcHost;
}
namespace castmesh::progress {
class Strand;
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
  // Landing memory for pipelined collectives, kept between calls. Any thread.
  collectives::ScratchPool& scratch() { return scratch_; }

  // Starts sending `bytes` bytes to rank `dest`. Small messages, and all
  // within this process, are copied out before this returns (the request
  // is complete); a large one (kSingleCopyMinBytes) to another process
  // stays in `data` until the receiver has read it (single copy) or the
  // transport has written it to the socket, so `data` must stay valid and
  // unchanged until the request completes.
  std::shared_ptr<RequestState> start_send(collectives::Channel channel, int dest, int64_t tag, const void* data,
                                           size_t bytes, const std::string& signature = {}, uint64_t sequence = 0);
  // start_send, then waits for it (a send that completes at once allocates
  // no request).
  absl::Status send(collectives::Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                    const std::string& signature = {}, uint64_t sequence = 0);
  // The receiver of single-copy message `token` has read it, or (fallback)
  // could not: then the body goes out as a frame now.
  void on_send_done(uint64_t token, bool fallback);
  // A single-copy send whose collective failed before the receiver answered:
  // its bytes are copied now, so a late answer asking for them (the
  // receiver's read failed) is served from the copy, or, when an answer is
  // being handled now, waited for; afterwards the send reads `data` no more.
  // The sending thread, before its buffers go.
  void abandon_send(const std::shared_ptr<RequestState>& request);
  // Proc `proc` is lost: sends waiting for a rank there fail with `why`.
  void fail_sends_to(const ProcId& proc, const absl::Status& why);
  // Posts a receive of at most `capacity` bytes into `buffer`.
  std::shared_ptr<RequestState> post_recv(collectives::Channel channel, int source, int64_t tag, void* buffer,
                                          size_t capacity, collectives::CallSignature signature = nullptr);
  // A fresh collective sequence number (the same on every rank for the
  // n-th collective it calls).
  uint64_t next_sequence() { return next_sequence_.fetch_add(1, std::memory_order_relaxed); }
  // Collective `sequence` failed here: fail it on every rank.
  void abort(uint64_t sequence, const absl::Status& why);
  // Runs `op` on the progress engine's workers after the group's earlier
  // non-blocking operations (one strand per group); the request completes
  // with its result, or with kCancelled when the group's last user handle
  // goes before it started (see user_handle). Any thread.
  Request run_async(std::function<absl::Status()> op);

  // What a Communicator holds: `group` itself, but counted as one of the
  // group's user handles. When the last user handle of a group that is not
  // pinned (a split or dup communicator) goes while non-blocking
  // operations are queued or running, they fail with kCancelled and the
  // group's receives are closed (the running one ends at once), instead of
  // waiting for peers that may never come. Any thread.
  static std::shared_ptr<CommGroup> user_handle(std::shared_ptr<CommGroup> group);

  explicit CommGroup(Layout layout);

 private:
  // A single-copy send waiting for its receiver.
  struct PendingSend {
    int dest = 0;
    collectives::Channel channel = collectives::Channel::kP2P;
    int64_t tag = 0;
    std::string signature;
    uint64_t sequence = 0;
    const void* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<RequestState> request;
    std::shared_ptr<const std::string> abandoned;  // the bytes, once abandon_send copied them
  };
  // Sets `header` (cleared first) to a frame header from this rank to `dest`.
  void fill_frame_header(wire::v1::CollectiveHeader& header, collectives::Channel channel, int dest, int64_t tag,
                         std::string_view signature, uint64_t sequence) const;
  // Sends one frame to rank `dest` of another proc; with `body_owner`, a
  // body that goes over the socket leaves from `body` itself and
  // `body_owner` is released once the transport is done with it.
  absl::Status send_frame(int dest, const wire::v1::CollectiveHeader& header, const void* body, size_t bytes,
                          std::shared_ptr<const void> body_owner = nullptr);
  std::shared_ptr<RequestState> start_single_copy(PendingSend send);
  // The sends that complete before they return (bad rank, dead rank, this
  // process, a small message on a started ring): their result; nullopt for
  // the others.
  std::optional<absl::Status> send_at_once(collectives::Channel channel, int dest, int64_t tag, const void* data,
                                           size_t bytes, const std::string& signature, uint64_t sequence);
  // The rest of start_send: single copy, or a frame.
  std::shared_ptr<RequestState> start_send_frame(collectives::Channel channel, int dest, int64_t tag,
                                                 const void* data, size_t bytes, const std::string& signature,
                                                 uint64_t sequence);

  struct UserHandle;
  // The last user handle went (UserHandle's destructor).
  void on_last_handle_gone();

  Layout layout_;
  std::shared_ptr<collectives::RankMailbox> mailbox_;
  std::shared_ptr<progress::Strand> strand_;
  std::atomic<bool> pinned_{false};  // kept by the process (CommGroup::Get with pin)
  detail::Mutex handle_mu_;
  std::weak_ptr<UserHandle> handle_ ABSL_GUARDED_BY(handle_mu_);
  std::atomic<uint64_t> next_sequence_{1};
  collectives::ScratchPool scratch_;
  detail::Mutex sends_mu_;
  absl::flat_hash_map<uint64_t, PendingSend> pending_sends_ ABSL_GUARDED_BY(sends_mu_);
};

}  // namespace castmesh::detail
