// RemoteMonitors: monitors of actors that live in other procs.
//
// Monitoring side: the runtime asks the router to watch a remote actor once
// (RemoteRouter::watch, then watch() here), which becomes a Monitor message
// to the actor's proc; the ActorDown answer, or the loss of that proc, is
// reported to the runtime, which tells every monitor of the actor once.
// Owning side: a Monitor from a peer watches the local actor and answers
// ActorDown when it stops (at once when it is not there).
//
// One per ProcHost, installed by ProcHost::attach, which calls watch() from
// its router and forget_peer() when a peer is lost.
//
// Threading: thread-safe. The control handlers run on the host's I/O
// thread; watch() on any thread; a watched local actor's stop is reported
// on the thread where it stopped, possibly after the host is gone (then
// nothing is sent).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/supervision.h"
#include "core/proc/proc_service.h"

namespace castmesh {
class Runtime;
}

namespace castmesh::proc {

class ProcHost;

class RemoteMonitors : public ProcService, public std::enable_shared_from_this<RemoteMonitors> {
 public:
  // Registers the Monitor and ActorDown handlers on `host`.
  explicit RemoteMonitors(ProcHost& host);
  // Stops sending: stops of local actors watched for peers are not reported.
  void detach() override;

  // Monitoring side: asks the proc of `actor` to report its stop (the host's
  // router calls this for RemoteRouter::watch; the host is alive).
  void watch(const Address& actor);
  // `peer` is lost: forgets what was watched there and for it. Called by the
  // host before it reports the loss to the runtime, so a monitor started
  // after that report is not forgotten.
  void forget_peer(const ProcId& peer);

 private:
  void handle_actor_down(const ProcId& peer, const std::string& payload);
  void handle_monitor(const ProcId& peer, const std::string& payload);
  void on_watched_actor_down(const ProcId& peer, const std::string& actor, const DownEvent& event);

  detail::SharedMutex host_mu_;
  ProcHost* host_ ABSL_GUARDED_BY(host_mu_);  // nullptr once detached
  Runtime& runtime_;                          // the host's; outlives this service's use
  const ProcId id_;

  detail::Mutex mu_;
  uint64_t next_monitor_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Monitoring side: remote actor -> id of the Monitor sent for it (an
  // ActorDown with another id is stale and ignored).
  absl::flat_hash_map<Address, uint64_t> monitors_sent_ ABSL_GUARDED_BY(mu_);
  // Owning side: peer -> (local actor -> latest monitor id from that peer).
  absl::flat_hash_map<ProcId, absl::flat_hash_map<std::string, uint64_t>> monitors_served_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::proc
