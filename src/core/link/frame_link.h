// FrameLink: messages to a proc of another process as communicator frames
// (a CollectiveHeader and a body) over the shared-memory ring to that proc
// once it is up (link/shm_ring_path.h: same host), else over the procs'
// transport connection. Which of the two carries a frame is not the
// selector's choice: the ring takes over in band (LINK_OFFER/ACCEPT/START)
// and then carries every later frame, so MPI's non-overtaking order holds.
//
// Small bodies go as one compact ring record or one frame, copied out
// before send_now returns. Large ones (post_send) are written to the socket
// from the caller's buffer itself (no copy; the request completes when the
// transport lets go of it); a ring copies them at once.
#pragma once

#include <memory>
#include <string_view>

#include "core/link/link.h"

namespace castmesh::proc {
class ProcHost;
}
namespace castmesh::wire::v1 {
class CollectiveHeader;
}

namespace castmesh::link {

// Bodies of at least this many bytes leave from the caller's buffer (the
// transport writes them from there; a ring copies them at once) instead of
// being copied into the frame first (docs/architecture.md, "Link layer").
inline constexpr size_t kInPlaceMinBytes = 64 * 1024;

// One per communicator rank (it holds the proc's transport). Thread-safe.
class FrameLink final : public Link {
 public:
  explicit FrameLink(std::weak_ptr<proc::ProcHost> host) : host_(std::move(host)) {}
  // kShmRing once the ring to `peer` is started, else kSocket.
  Path path(const ProcId& peer) const override;
  Capabilities capabilities() const override;
  // A compact ring record when the ring is started, else one frame.
  std::optional<absl::Status> send_now(const ProcId& peer, const Envelope& envelope, const void* data,
                                       size_t bytes) override;
  // The body written from `data` itself; completes when the transport is
  // done with it (written, or the connection lost: the receiver then fails
  // on its own).
  std::shared_ptr<detail::RequestState> post_send(const ProcId& peer, const Envelope& envelope, const void* data,
                                                  size_t bytes) override;
  absl::Status send_abort(const ProcId& peer, const Envelope& envelope, const absl::Status& why) override;

  // Sets `header` (cleared first) to the frame header of `envelope`.
  static void fill_header(wire::v1::CollectiveHeader& header, const Envelope& envelope);
  // Sends one frame to proc `peer` (rank `dest`, for the error); with
  // `body_owner`, a body that goes over the socket leaves from `body`
  // itself and `body_owner` is released once the transport is done with it.
  absl::Status send_frame(const ProcId& peer, int dest, const wire::v1::CollectiveHeader& header, const void* body,
                          size_t bytes, std::shared_ptr<const void> body_owner = nullptr);

 private:
  const std::weak_ptr<proc::ProcHost> host_;
};

}  // namespace castmesh::link
