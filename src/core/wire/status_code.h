// Statuses on the wire: control messages carry an absl::Status as an int
// code and a message. Any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace castmesh::wire {

// The status a peer sent as (code, message). A code outside absl's range
// (a peer of another version, or a corrupt field) becomes UNKNOWN naming
// it, never an absl::Status with an invalid code.
inline absl::Status status_from_wire(int code, const std::string& message) {
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat(message, " (status code ", code, ")"));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

// The status of a message with the usual error_code / error_message fields.
template <typename Message>
absl::Status status_from_wire(const Message& message) {
  return status_from_wire(message.error_code(), message.error_message());
}

// Writes `status` into a message's error_code / error_message fields: the one
// way a status goes on the wire (status_from_wire reads it back).
template <typename Message>
void status_to_wire(const absl::Status& status, Message* message) {
  message->set_error_code(static_cast<int32_t>(status.code()));
  message->set_error_message(std::string(status.message()));
}

}  // namespace castmesh::wire
