// Codecs for the small messages tests send across procs: an integer as
// decimal text, and messages without fields. One copy for every test that
// registers messages (CASTMESH_REGISTER_MESSAGE) for worker procs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace castmesh::testing {

// Writes `n` as decimal text.
inline absl::Status encode_decimal(int64_t n, std::string* out) {
  *out = std::to_string(n);
  return absl::OkStatus();
}

// Reads decimal text written by encode_decimal.
inline absl::Status decode_decimal(std::string_view bytes, int64_t* n) {
  return absl::SimpleAtoi(absl::string_view(bytes.data(), bytes.size()), n)
             ? absl::OkStatus()
             : absl::InvalidArgumentError("not a decimal number");
}

// The codec of a message type without fields: nothing on the wire.
template <typename M>
absl::Status encode_empty(const M&, std::string* out) {
  out->clear();
  return absl::OkStatus();
}
template <typename M>
absl::Status decode_empty(std::string_view, M*) {
  return absl::OkStatus();
}

}  // namespace castmesh::testing
