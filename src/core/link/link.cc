#include "core/link/link.h"

#include <unistd.h>

#include "core/link/transfers.h"
#include "core/platform/process_memory.h"

namespace castmesh::link {

std::string_view path_name(Path path) {
  switch (path) {
    case Path::kInProcess: return "in_process";
    case Path::kShmRing: return "shm_ring";
    case Path::kSingleCopy: return "single_copy";
    case Path::kSocket: return "socket";
    case Path::kSharedSegment: return "shared_segment";
    case Path::kIbverbs: return "ibverbs";
    case Path::kDeviceStaging: return "device_staging";
    case Path::kFake: return "fake";
  }
  return "unknown";
}

Region local_region(const void* data, size_t bytes) {
  Region region;
  region.pid = static_cast<int64_t>(::getpid());
  region.host_identity = platform::host_identity();
  region.address = reinterpret_cast<uint64_t>(data);
  region.bytes = bytes;
  return region;
}

absl::Status Link::read(const Region& remote, uint64_t offset, void* out, size_t bytes) {
  (void)remote, (void)offset, (void)out, (void)bytes;
  return absl::UnimplementedError("this link has no one-sided reads");
}

absl::Status Link::write(const Region& remote, uint64_t offset, const void* in, size_t bytes) {
  (void)remote, (void)offset, (void)in, (void)bytes;
  return absl::UnimplementedError("this link has no one-sided writes");
}

std::shared_ptr<detail::RequestState> Link::post_send(const ProcId& peer, const Envelope& envelope, const void* data,
                                                      size_t bytes) {
  (void)peer, (void)envelope, (void)data, (void)bytes;
  return detail::RequestState::Done(absl::UnimplementedError("this link has no two-sided sends"));
}

absl::Status Link::send_abort(const ProcId& peer, const Envelope& envelope, const absl::Status& why) {
  (void)peer, (void)envelope, (void)why;
  return absl::UnimplementedError("this link has no two-sided sends");
}

void Link::start(const std::shared_ptr<Transfer>& transfer) { start_next(transfer); }

}  // namespace castmesh::link
