#include "core/rdma/routes.h"

#include <iterator>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/link/selector.h"
#include "core/link/single_copy.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process_memory.h"
#include "core/rdma/ibverbs_path.h"
#include "core/rdma/lease_link.h"
#include "core/rdma/one_sided.h"
#include "core/rdma/segment_path.h"
#include "core/rdma/socket_link.h"
#include "core/tensor/device_engine.h"

namespace castmesh::rdma {
namespace {

// CASTMESH_RDMA_FALLBACK (or the operation's own, `chosen`): OK(true) =
// "error" (no fallback), OK(false) = "auto"; the environment's error when a
// setting there is unknown or malformed.
absl::StatusOr<bool> fallback_forbidden(std::optional<config::RdmaFallback> chosen) {
  if (absl::Status settings = config::check_environment(); !settings.ok()) return settings;
  return chosen.value_or(config::global().rdma_fallback) == config::RdmaFallback::kError;
}

// Whether ibverbs can carry operations on `handle` (of any size: a 0-byte
// READ/WRITE is a legal work request).
bool ibverbs_reaches(const detail::RdmaHandle& handle) {
  return offers(handle, RdmaTransport::kIbverbs) && handle.nic_address != 0 &&
         IbverbsPath::instance().reachable(handle.owner);
}

// Why ibverbs does not carry operations on `handle`, for the log and errors.
std::string why_no_ibverbs(const detail::RdmaHandle& handle) {
  IbverbsPath& path = IbverbsPath::instance();
  if (!path.usable()) return path.why_not();
  if (owner_on_device(handle)) {
    return absl::StrCat("proc ", handle.owner, "'s buffer is ", handle.device.to_string(),
                        " memory, which castmesh never registers with a NIC (GPUDirect RDMA is not implemented)");
  }
  if (!offers(handle, RdmaTransport::kIbverbs) || handle.nic_address == 0) {
    return absl::StrCat("proc ", handle.owner, " registered its buffer without an RDMA NIC");
  }
  return path.why_unreachable(handle.owner);
}

// The link of each path of kCostTable that RDMA buffers take.
link::Link* link_of(link::Path path) {
  switch (path) {
    case link::Path::kIbverbs: return &ibverbs_link();
    case link::Path::kSingleCopy: return &lease_link();
    case link::Path::kSharedSegment: return &shared_segment_link();
    case link::Path::kSocket: return &socket_link();
    default: return nullptr;  // not offered to RDMA buffers (never available below)
  }
}

}  // namespace

bool owner_on_device(const detail::RdmaHandle& handle) { return castmesh::detail::is_engine_device(handle.device); }

absl::StatusOr<link::Routes> choose_routes(const detail::RdmaHandle& handle, size_t length,
                                                       std::optional<config::RdmaFallback> fallback) {
  absl::StatusOr<bool> forbidden = fallback_forbidden(fallback);
  if (!forbidden.ok()) return forbidden.status();
  const bool same_host = handle.host_identity == platform::host_identity();
  const link::Placement placement = same_host ? link::Placement::kSameHost : link::Placement::kOtherHost;
  link::Available available;
  if (ibverbs_reaches(handle)) available.add(link::Path::kIbverbs);
  if (!available.has(link::Path::kIbverbs)) {
    if (*forbidden) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CASTMESH_RDMA_FALLBACK=error and no ibverbs path to proc ", handle.owner, " (", why_no_ibverbs(handle),
          "); set CASTMESH_RDMA_FALLBACK=auto to use same-host single copy or the socket transport"));
    }
    static std::once_flag logged;
    std::call_once(logged, [&handle] {
      CASTMESH_LOG_INFO("castmesh-rdma: {}; RDMA buffers between procs use same-host single copy (or a shared "
                        "segment) and the socket transport (CASTMESH_RDMA_FALLBACK=error forbids that)",
                        why_no_ibverbs(handle));
    });
    if (CASTMESH_LINUX_FACILITIES && config::global().rdma_single_copy &&
        offers(handle, RdmaTransport::kSingleCopy) && link::single_copy_usable()) {
      available.add(link::Path::kSingleCopy);
    }
    // Where the kernel refuses (or the switch forbids) single copy.
    if (placement == link::Placement::kSameHost && offers(handle, RdmaTransport::kSharedSegment) &&
        shared_segment_reaches(handle.owner)) {
      available.add(link::Path::kSharedSegment);
    }
    if (offers(handle, RdmaTransport::kSocket)) available.add(link::Path::kSocket);
  }
  link::Path paths[std::size(link::kCostTable)];
  const size_t n = link::choose_in_order(placement, length, available, paths);
  if (n == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("proc ", handle.owner, " offers no transport this proc has for its RDMA buffer"));
  }
  link::Routes routes;
  // Same host: a one-sided copy first, with no message to the owner (one_sided.h).
  if (paths[0] != link::Path::kIbverbs && handle.one_sided.generation != 0 && same_host &&
      offers(handle, RdmaTransport::kSingleCopy) && one_sided_enabled()) {
    routes.push_back(&table_link());
  }
  for (size_t i = 0; i < n; ++i) routes.push_back(link_of(paths[i]));
  return routes;
}

link::Routes release_routes() { return {&socket_link()}; }

RdmaTransport transport_of(link::Path path) {
  switch (path) {
    case link::Path::kIbverbs: return RdmaTransport::kIbverbs;
    case link::Path::kInProcess: return RdmaTransport::kSameProcess;
    case link::Path::kSingleCopy: return RdmaTransport::kSingleCopy;
    case link::Path::kSharedSegment: return RdmaTransport::kSharedSegment;
    default: return RdmaTransport::kSocket;
  }
}

}  // namespace castmesh::rdma
