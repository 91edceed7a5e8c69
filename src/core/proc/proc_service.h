// Proc services: per-proc features (cast relay, collectives bootstrap and
// data channel, RDMA registry, ...) that talk to their peers in other procs
// over the proc's control channel. The proc layer knows none of the
// registered ones by name: each registers an installer once per process
// (normally from a static initializer in its own source file), and every
// ProcHost calls every installer when it attaches, before it is announced
// ready, so a service's handlers are in place before any peer can reach the
// proc. The proc layer's own services (RemoteSupervision, SpawnService,
// RemoteMonitors) implement the same interface but are created by
// ProcHost::attach itself. docs/architecture.md: adding a service.
//
// Threading: register_proc_service is thread-safe. Installers run on the
// thread calling ProcHost::attach. A service's detach() runs once, from the
// host's destructor, before the host's endpoint stops; afterwards the
// service must not touch the host again.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace castmesh::proc {

class ProcHost;

// One service installed on one ProcHost. Owned by that host.
class ProcService {
 public:
  virtual ~ProcService() = default;
  // The host is going away: stop using it, fail what waits on peers.
  virtual void detach() = 0;
};

// Creates the service for `host` and registers its handlers on it
// (ProcHost::on_control / on_data / add_peer_lost_observer).
using ProcServiceInstaller = std::function<std::shared_ptr<ProcService>(ProcHost& host)>;

// Registers `installer` under `name` for every ProcHost attached from now
// on in this process. A second registration of one name replaces the first.
void register_proc_service(std::string name, ProcServiceInstaller installer);

// The registered services, in registration order (used by ProcHost::attach).
std::vector<std::pair<std::string, ProcServiceInstaller>> registered_proc_services();

}  // namespace castmesh::proc
