#include "core/rdma/registration.h"

#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/rdma/ibverbs_path.h"

namespace castmesh::rdma {
namespace {

// Device memory: only the transports in which the owner's CPU stages the
// bytes (a peer's process_vm_readv and the NIC cannot reach it).
std::vector<RdmaTransport> transports_of_this_proc(bool nic, bool device) {
  std::vector<RdmaTransport> offered;
  if (nic) offered.push_back(RdmaTransport::kIbverbs);
  offered.push_back(RdmaTransport::kSameProcess);
  if (CASTMESH_LINUX_FACILITIES && !device) offered.push_back(RdmaTransport::kSingleCopy);
  offered.push_back(RdmaTransport::kSharedSegment);  // POSIX shm_open: every build
  offered.push_back(RdmaTransport::kSocket);
  return offered;
}

}  // namespace

Registered register_with_paths(const TensorView& view, RdmaAccess access, const ProcId& owner, bool device) {
  // The NIC registration (ibverbs) when this process has a NIC; without
  // one (or when the NIC refuses the range) the buffer offers the others.
  NicRange nic;
  // (GPUDirect RDMA is not implemented: device memory is never given to the NIC.)
  if (view.nbytes() > 0 && !device && IbverbsPath::instance().usable()) {
    absl::StatusOr<NicRange> registered = IbverbsPath::instance().register_range(view.data(), view.nbytes(), access);
    if (registered.ok()) {
      nic = *std::move(registered);
    } else {
      CASTMESH_LOG_WARN_LIMITED("castmesh-rdma: the NIC refused to register {} ({}); this buffer is offered over "
                                "the other transports",
                                view.to_string(), std::string(registered.status().message()));
    }
  }
  Registered out;
  out.registration = Registry::instance().add(view, access, owner, nic.registration, nic.rkey);
  out.transports = transports_of_this_proc(out.registration->nic != nullptr, device);
  if (!device) out.table = one_sided_publish(*out.registration);
  return out;
}

void retire_from_paths(const std::shared_ptr<const Registration>& released, proc::ProcHost* host) {
  one_sided_retire(released);
  IbverbsPath::instance().retire(released, host);
}

}  // namespace castmesh::rdma
