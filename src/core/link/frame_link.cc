#include "core/link/frame_link.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/link/shm_ring_path.h"
#include "core/platform/thread_cache.h"
#include "core/proc/proc_host.h"

namespace castmesh::link {

namespace v1 = wire::v1;

Path FrameLink::path(const ProcId& peer) const {
  return shm_link_started(peer) ? Path::kShmRing : Path::kSocket;
}

Capabilities FrameLink::capabilities() const {
  Capabilities caps;
  caps.send_holds_buffer = true;  // post_send's body leaves from the caller's buffer
  return caps;
}

void FrameLink::fill_header(v1::CollectiveHeader& header, const Envelope& e) {
  header.Clear();  // keeps the memory of its string fields
  header.mutable_comm()->assign(e.comm.data(), e.comm.size());
  header.set_source(static_cast<uint32_t>(e.source));
  header.set_dest(static_cast<uint32_t>(e.dest));
  header.set_channel(e.collective ? v1::CollectiveHeader::CHANNEL_COLLECTIVE : v1::CollectiveHeader::CHANNEL_P2P);
  header.set_tag(e.tag);
  header.set_sequence(e.sequence);
  header.mutable_signature()->assign(e.signature.data(), e.signature.size());
}

absl::Status FrameLink::send_frame(const ProcId& peer, int dest, const v1::CollectiveHeader& header, const void* body,
                                   size_t bytes, std::shared_ptr<const void> body_owner) {
  std::shared_ptr<proc::ProcHost> host = host_.lock();
  if (host == nullptr) return absl::UnavailableError("this proc's transport is shut down");
  platform::ThreadLoan<std::string> encoded;
  header.SerializeToString(&*encoded);
  absl::Status sent = send_collective_frame(
      *host, peer, *encoded, std::string_view(static_cast<const char*>(body), bytes), std::move(body_owner));
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("sending to rank ", dest, " (proc ", peer, "): ", sent.message()));
  }
  return absl::OkStatus();
}

std::optional<absl::Status> FrameLink::send_now(const ProcId& peer, const Envelope& e, const void* data,
                                                size_t bytes) {
  if (bytes >= kInPlaceMinBytes) return std::nullopt;  // post_send: written in place
  std::optional<absl::Status> sent =
      try_send_compact(peer, e, std::string_view(static_cast<const char*>(data), bytes));
  if (sent) {
    if (sent->ok()) return sent;
    return absl::Status(sent->code(),
                        absl::StrCat("sending to rank ", e.dest, " (proc ", peer, "): ", sent->message()));
  }
  platform::ThreadLoan<v1::CollectiveHeader> header;  // no allocation per frame
  fill_header(*header, e);
  return send_frame(peer, e.dest, *header, data, bytes);
}

std::shared_ptr<detail::RequestState> FrameLink::post_send(const ProcId& peer, const Envelope& e, const void* data,
                                                           size_t bytes) {
  const MessageStatus sent{e.source, static_cast<int>(e.tag), bytes};
  platform::ThreadLoan<v1::CollectiveHeader> header;
  fill_header(*header, e);
  auto request = std::make_shared<detail::RequestState>();
  std::shared_ptr<const void> owner(nullptr, [request, sent](const void*) { request->complete(sent); });
  // A send refused at once fails its request before this copy of the owner
  // goes (its release would complete it as sent).
  if (absl::Status st = send_frame(peer, e.dest, *header, data, bytes, owner); !st.ok()) request->complete(st);
  return request;
}

absl::Status FrameLink::send_abort(const ProcId& peer, const Envelope& e, const absl::Status& why) {
  v1::CollectiveHeader header;
  Envelope abort = e;
  // The receiver fails the collective with kAborted and this text.
  abort.signature = std::string_view(why.message().data(), why.message().size());
  fill_header(header, abort);
  header.set_channel(v1::CollectiveHeader::CHANNEL_ABORT);
  return send_frame(peer, e.dest, header, nullptr, 0);
}

}  // namespace castmesh::link
