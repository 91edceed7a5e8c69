// Exchange: the process-wide switchboard of communicators. It owns every
// rank mailbox of this process (keyed by communicator id and rank), keeps
// the rank groups that must outlive their handles, receives the data
// messages other procs send to those ranks (as the "collectives" proc
// service: ProcHost data messages of type kCollectiveDataType), and fails
// the ranks of a lost proc in every mailbox that expects messages from them.
//
// Thread-safe. Frames arrive on proc I/O threads; everything else from
// caller threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "core/collectives/rank_mailbox.h"
#include "core/link/receiver.h"
#include "core/wire/payload.h"

namespace castmesh::detail {
class CommGroup;
}
namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::link {
struct Envelope;
}

namespace castmesh::collectives {

using CompactMessage = link::Envelope;

// The ProcHost data message types of communicator frames and of the
// shared-memory link handshake (core/link/receiver.h).
using link::kCollectiveDataType;
using link::kCollectiveLinkDataType;

class Exchange {
 public:
  static Exchange& instance();

  // The mailbox of rank `rank` of communicator `comm`, made on first use
  // (messages may arrive before the rank makes its communicator).
  std::shared_ptr<RankMailbox> mailbox(const std::string& comm, int rank);
  // The group of (comm, rank): the live one, or make() (then kept alive by
  // the exchange when `pin`, else by its handles only).
  std::shared_ptr<detail::CommGroup> group(const std::string& comm, int rank, bool pin,
                                           const std::function<std::shared_ptr<detail::CommGroup>()>& make);
  // Rank `rank` of `comm` lives here; rank r of it in procs[r]: its
  // mailbox fails the ranks of procs that are lost from now on.
  void watch(const std::string& comm, int rank, std::vector<ProcId> procs, std::string description);
  // The group of (comm, rank) is gone; forget its mailbox.
  void forget(const std::string& comm, int rank);
  // Stops keeping alive the groups whose id is `id` or starts with `id` + "/"
  // (a mesh's communicator and those made from it with along()): they go
  // with their last handle, their device communicators with them. Called
  // when a mesh is dropped from this process.
  void unpin(const std::string& id);
  // How many groups of this process are alive (diagnostics and tests).
  size_t live_groups();

  // A frame from proc `peer` to proc `host` (ProcHost data handler, on
  // `delivering`'s I/O thread: `delivering` is `host`, alive for the call).
  void on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header,
                wire::Payload payload, proc::ProcHost& delivering);
  // The same for a frame whose body is `body[0, size)`, owned by `owner`
  // when not empty (else read before this returns): a shared-memory ring
  // record (core/link/shm_ring_path.h), on a consumer thread.
  // `delivering`: the host whose I/O thread delivers a socket frame (link
  // handshake frames need it), or nullptr for a ring record.
  void on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header,
                const char* body, size_t size, wire::Payload owner, proc::ProcHost* delivering = nullptr);
  // A compact ring record (core/link/shm_ring_path.h): a data message whose
  // body `body[0, size)` is read before this returns. On a ring consumer.
  void on_compact(const CompactMessage& message, const char* body, size_t size);
  // A sink for the body of a frame whose header arrived from `peer`, when a
  // posted receive matches it (RankMailbox::sink_for); else nullptr.
  std::shared_ptr<transport::PayloadSink> sink_for_frame(const ProcId& peer, std::string_view header,
                                                         uint64_t size);
  // A single-copy receive that must wait for the body as a frame (the
  // kernel refused the read): parked until that frame comes.
  void park(const ProcId& peer, uint64_t token, PostedRecv recv, MessageKey key);
  // Proc `peer` is lost (ProcHost peer-lost observer, I/O thread).
  void on_peer_lost(const ProcId& peer, const absl::Status& why);
  // Proc `peer` answered after it was reported lost (e.g. it was not
  // listening yet when first dialled): groups made from now on trust it.
  void on_peer_alive(const ProcId& peer);

 private:
  struct Entry {
    std::shared_ptr<RankMailbox> mailbox;
    std::vector<ProcId> procs;  // by rank; empty until watch()
    std::string description;    // "communicator of mesh 'worker'"
    std::weak_ptr<detail::CommGroup> group;
    std::shared_ptr<detail::CommGroup> pinned;
  };
  Entry& entry(const std::string& comm, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // mailbox() through a small per-thread cache, for the ring consumers: no
  // lock, no hashing, no reference count on the hot path. Entries are
  // dropped when forget() removes any mailbox. The pointer stays valid until
  // this thread's next call (the cache holds the mailbox), or while `hold`
  // does (set when the thread's cache is gone).
  RankMailbox* cached_mailbox(std::string_view comm, int rank, std::shared_ptr<RankMailbox>& hold);
  std::shared_ptr<detail::CommGroup> live_group(const std::string& comm, int rank);
  void deliver_fallback_body(const ProcId& peer, uint64_t token, const char* body, size_t size);

  struct Parked {
    PostedRecv recv;
    MessageKey key;
  };

  detail::Mutex mu_;
  // Bumped by forget() when it removes a mailbox (cached_mailbox's caches).
  std::atomic<uint64_t> forgotten_{0};
  absl::flat_hash_map<std::pair<std::string, int>, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcId, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<ProcId, uint64_t>, Parked> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::collectives
