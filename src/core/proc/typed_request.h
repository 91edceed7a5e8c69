// Sends a control request to a peer and parses its typed reply: the shape
// every caller of ProcHost::request has (the trace, stack and metrics
// services; docs/architecture.md, "Adding a service").
//
// Threading: blocks its caller up to `timeout`; never on the host's I/O thread.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/proc/proc_host.h"

namespace castmesh::proc {

// Sends `request` to `peer` and parses the answer as a `Reply`. A failed
// request keeps its code; its message is the host's, or "no <what> from
// <peer>: ..." when `what` names the reply. A reply that does not parse is
// DATA_LOSS: "malformed <what, or the reply's type name> from <peer>".
template <typename Reply>
absl::StatusOr<Reply> request_reply(ProcHost& host, const ProcId& peer,
                                    const google::protobuf::MessageLite& request, absl::Duration timeout,
                                    std::string_view what = {}) {
  absl::StatusOr<std::string> payload = host.request(peer, request, timeout);
  if (!payload.ok()) {
    if (what.empty()) return payload.status();
    return absl::Status(payload.status().code(), absl::StrCat("no ", std::string(what), " from ", host.describe(peer),
                                                              ": ", payload.status().message()));
  }
  Reply reply;
  if (!reply.ParseFromString(*payload)) {
    const std::string name = what.empty() ? reply.GetTypeName() : std::string(what);
    return absl::DataLossError(absl::StrCat("malformed ", name, " from ", host.describe(peer)));
  }
  return reply;
}

}  // namespace castmesh::proc
