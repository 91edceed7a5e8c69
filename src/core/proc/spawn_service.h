// SpawnService: spawns actors by registered type name (CASTMESH_REGISTER_ACTOR)
// for other procs. Serves SpawnRequest control requests (answered with
// SpawnReply: the new actor's address or why it could not be spawned) and
// tells RemoteSupervision who spawned each actor, so its failure goes back
// to the spawner.
//
// One per ProcHost, installed by ProcHost::attach.
//
// Threading: the handler runs on the host's I/O thread; an actor's
// constructor runs there too.
#pragma once

#include <cstdint>
#include <string>

#include "castmesh/address.h"
#include "core/proc/proc_service.h"

namespace castmesh::proc {

class ProcHost;
class RemoteSupervision;

class SpawnService : public ProcService {
 public:
  // Registers the SpawnRequest handler on `host`; `supervision` (the
  // host's) learns the spawner of every actor spawned.
  SpawnService(ProcHost& host, RemoteSupervision& supervision);
  // Nothing to stop: the handler stops with the host's I/O thread.
  void detach() override {}

 private:
  void handle_spawn(const ProcId& peer, uint64_t correlation, const std::string& payload);

  // Both own or outlive this service; the handler stops before the host goes.
  ProcHost& host_;
  RemoteSupervision& supervision_;
};

}  // namespace castmesh::proc
