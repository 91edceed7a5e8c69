#include "core/link/in_process_link.h"

#include <string>

#include "core/link/receiver.h"

namespace castmesh::link {

InProcessLink& InProcessLink::instance() {
  static auto* link = new InProcessLink;  // leaked: used until the process ends
  return *link;
}

std::optional<absl::Status> InProcessLink::send_now(const ProcId&, const Envelope& e, const void* data,
                                                    size_t bytes) {
  receiver().on_compact(e, static_cast<const char*>(data), bytes);
  return absl::OkStatus();
}

std::shared_ptr<detail::RequestState> InProcessLink::post_send(const ProcId& peer, const Envelope& e,
                                                               const void* data, size_t bytes) {
  (void)*send_now(peer, e, data, bytes);
  return detail::RequestState::Done(MessageStatus{e.source, static_cast<int>(e.tag), bytes});
}

absl::Status InProcessLink::send_abort(const ProcId&, const Envelope& e, const absl::Status& why) {
  receiver().abort_collective(e.comm, e.dest, e.sequence, why);
  return absl::OkStatus();
}

}  // namespace castmesh::link
