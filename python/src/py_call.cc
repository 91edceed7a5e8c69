// Wire form of PyCall: 4-byte little-endian endpoint length, a flags byte
// (bit 0: oneway), endpoint, payload.
#include "py_call.h"

#include <cstdint>
#include <string_view>

#include "castmesh/message.h"

namespace castmesh::python {
namespace {

absl::Status encode_py_call(const PyCall& call, std::string* out) {
  const auto n = static_cast<uint32_t>(call.endpoint.size());
  out->clear();
  out->reserve(5 + call.endpoint.size() + call.payload.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->push_back(call.oneway ? 1 : 0);
  out->append(call.endpoint);
  out->append(call.payload);
  return absl::OkStatus();
}

absl::Status decode_py_call(std::string_view bytes, PyCall* call) {
  if (bytes.size() < 5) return absl::InvalidArgumentError("PyCall: truncated header");
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (bytes.size() - 5 < n) return absl::InvalidArgumentError("PyCall: endpoint name longer than the message");
  call->oneway = (bytes[4] & 1) != 0;
  call->endpoint.assign(bytes.substr(5, n));
  call->payload.assign(bytes.substr(5 + n));
  return absl::OkStatus();
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(PyCall, "castmesh.python.PyCall", encode_py_call, decode_py_call);

}  // namespace castmesh::python
