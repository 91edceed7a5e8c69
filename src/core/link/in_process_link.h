// InProcessLink: messages between two ranks of this process. The sender
// copies the body into the receiver's matching layer at once (into a posted
// receive, else the unexpected queue): one memcpy, nothing in flight.
#pragma once

#include "core/link/link.h"

namespace castmesh::link {

// Stateless; one per process (instance()). Thread-safe.
class InProcessLink final : public Link {
 public:
  static InProcessLink& instance();
  Path path(const ProcId&) const override { return Path::kInProcess; }
  Capabilities capabilities() const override { return Capabilities{}; }
  // Always completes (OK): the receiving rank's mailbox takes the bytes.
  std::optional<absl::Status> send_now(const ProcId& peer, const Envelope& envelope, const void* data,
                                       size_t bytes) override;
  std::shared_ptr<detail::RequestState> post_send(const ProcId& peer, const Envelope& envelope, const void* data,
                                                  size_t bytes) override;
  absl::Status send_abort(const ProcId& peer, const Envelope& envelope, const absl::Status& why) override;
};

}  // namespace castmesh::link
