// RemoteSupervision: the supervision tree across procs. An actor spawned in
// this proc for another proc (SpawnService) has its parent there; when it
// fails, its failure goes back to the spawner as a Supervision control
// message (forward_failure), and the spawner delivers it to the parent
// actor (Actor::on_child_failed) or, with no parent left, to the root
// failure handler (or the log). The supervision logic inside one proc lives
// in the actor cells (core/actor/, core/supervision/).
//
// One per ProcHost, installed by ProcHost::attach; ProcHost::supervision()
// finds it.
//
// Threading: thread-safe. The Supervision handler and the failure observers
// run on the host's I/O thread and must not block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/supervision.h"
#include "core/proc/observer_registry.h"
#include "core/proc/proc_service.h"

namespace castmesh::proc {

class ProcHost;

class RemoteSupervision : public ProcService {
 public:
  using FailureObserver = std::function<void(const ProcId& peer, const SupervisionEvent& event)>;

  // Registers the Supervision handler on `host` (whose runtime is used).
  explicit RemoteSupervision(ProcHost& host);
  // Nothing to stop: every call comes through the host or its handlers.
  void detach() override {}

  // The actor `child` was spawned here for `spawner`'s actor `parent`
  // (SpawnService): its failure goes back there.
  void remember_spawned(const std::string& child, const ProcId& spawner, std::string parent);
  // Failures of actors this proc spawned for another proc go back to the
  // spawner as Supervision messages. True when `event` was such a failure.
  bool forward_failure(const SupervisionEvent& event);
  // Delivers a failure to the local actor `parent` (Actor::on_child_failed),
  // or, when `parent` is empty or gone, to the root failure handler (or the
  // log if there is none).
  void deliver_failure(const std::string& parent, SupervisionEvent event);
  // The handler of failures whose parent is not a local actor.
  void set_root_failure_handler(std::function<void(const SupervisionEvent&)> handler);
  // Called (I/O thread) for every failure a peer reports of an actor it
  // spawned for this proc (Supervision message), before it is delivered.
  uint64_t add_failure_observer(FailureObserver observer);
  void remove_failure_observer(uint64_t id);

 private:
  void handle_supervision(const ProcId& peer, const std::string& payload);

  // Owns this service. Every call reaches it through the host or the host's
  // handlers (which stop before the host goes), so no detach state is needed.
  ProcHost& host_;
  ObserverRegistry<ProcId, SupervisionEvent> failure_observers_;

  detail::Mutex mu_;
  // Actors spawned here for other procs: child address -> (spawner proc, parent address).
  absl::flat_hash_map<std::string, std::pair<ProcId, std::string>> spawned_for_others_ ABSL_GUARDED_BY(mu_);
  std::function<void(const SupervisionEvent&)> root_failure_handler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::proc
