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
#include "core/collectives/scratch_pool.h"
#include "core/link/selector.h"
#include "core/metrics/counters.h"
#include "core/progress/request_state.h"

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
    // Tests only: carries every message to a rank outside this process
    // instead of the real links (tests/core/link/fake_link.h).
    std::shared_ptr<link::Link> test_link;
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

  // The link for `bytes` bytes to rank `dest` (link/selector.h), and its
  // capabilities. Any thread.
  link::Route route(int dest, size_t bytes) { return links_.route(dest, bytes); }
  // Starts sending `bytes` bytes to rank `dest` on route(dest, bytes). When
  // the route's capabilities say send_holds_buffer, `data` must stay valid
  // and unchanged until the request completes (small messages, and all
  // within this process, are copied out before this returns).
  std::shared_ptr<RequestState> start_send(collectives::Channel channel, int dest, int64_t tag, const void* data,
                                           size_t bytes, const std::string& signature = {}, uint64_t sequence = 0);
  // start_send, then waits for it (a send that completes at once allocates
  // no request).
  absl::Status send(collectives::Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                    const std::string& signature = {}, uint64_t sequence = 0);
  // The receiver of single-copy message `token` has read it, or (fallback)
  // could not: then the body goes out as a frame now.
  void on_send_done(uint64_t token, bool fallback) { links_.on_single_copy_answer(token, fallback); }
  // A send whose collective failed while it may still be in flight: when
  // this returns its link reads `data` no more (link::Link::abandon_send).
  // The sending thread, before its buffers go.
  void abandon_send(const std::shared_ptr<RequestState>& request) { links_.abandon_send(request); }
  // Proc `proc` is lost: sends waiting for a rank there fail with `why`.
  void fail_sends_to(const ProcId& proc, const absl::Status& why) { links_.peer_lost(proc, why); }
  // Posts a receive of at most `capacity` bytes into `buffer`.
  std::shared_ptr<RequestState> post_recv(collectives::Channel channel, int source, int64_t tag, void* buffer,
                                          size_t capacity, collectives::CallSignature signature = nullptr);
  // A fresh collective sequence number (the same on every rank for the
  // n-th collective it calls).
  uint64_t next_sequence() { return next_sequence_.fetch_add(1, std::memory_order_relaxed); }
  // Calls and bytes per collective kind (core/metrics/counters.h). Any thread.
  metrics::CommunicatorCounters& counters() { return counters_; }
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
  // The checks every send makes first (bad rank, dead rank): the error.
  absl::Status check_dest(int dest) const;
  // The message's envelope, and a debug line naming the path of a collective step.
  link::Envelope envelope(collectives::Channel channel, int dest, int64_t tag, std::string_view signature,
                          uint64_t sequence) const;
  void log_step(const link::Envelope& envelope, size_t bytes);
  // Counts `bytes` on the data-plane path `link` takes to `proc` (metrics).
  static void count_path(const link::Link& link, const ProcId& proc, size_t bytes);

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
  link::Selector links_;
  metrics::CommunicatorCounters counters_;
};

}  // namespace castmesh::detail
