#include "core/wire/frame.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace castmesh::wire {

void append_frame_body(const google::protobuf::MessageLite& message, std::string& out) {
  const std::size_t body = message.ByteSizeLong();
  const std::size_t at = out.size();
  out.resize(at + kLengthPrefixSize + body);
  auto* p = reinterpret_cast<unsigned char*>(out.data() + at);
  p[0] = static_cast<unsigned char>(body);
  p[1] = static_cast<unsigned char>(body >> 8);
  p[2] = static_cast<unsigned char>(body >> 16);
  p[3] = static_cast<unsigned char>(body >> 24);
  message.SerializeWithCachedSizesToArray(p + kLengthPrefixSize);
}

std::uint32_t read_length_prefix(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t{u[0]} | (std::uint32_t{u[1]} << 8) | (std::uint32_t{u[2]} << 16) |
         (std::uint32_t{u[3]} << 24);
}

absl::Status check_body_size(std::uint32_t size, const FrameLimits& limits) {
  if (size == 0) return absl::InvalidArgumentError("empty frame body");
  if (size > limits.max_body_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame body of ", size, " bytes exceeds the limit of ", limits.max_body_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Envelope> parse_envelope(const char* body, std::size_t size,
                                            const FrameLimits& limits) {
  v1::Envelope envelope;
  if (!envelope.ParseFromArray(body, static_cast<int>(size))) {
    return absl::InvalidArgumentError(absl::StrCat("malformed envelope (", size, " bytes)"));
  }
  if (envelope.version() != kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unknown wire version ", envelope.version(),
                                                   " (this proc speaks ", kWireVersion, ")"));
  }
  if (envelope.payload_size() > limits.max_payload_size) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", envelope.payload_size(),
                                                   " bytes exceeds the limit of ",
                                                   limits.max_payload_size));
  }
  return envelope;
}

absl::StatusOr<FrameLimits> apply_environment(FrameLimits limits) {
  const char* value = std::getenv(kEnvMaxMessageBytes);
  if (value == nullptr || *value == '\0' || limits.max_payload_size != kDefaultMaxPayloadSize) return limits;
  const std::string_view text(value);
  std::uint64_t bytes = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  if (ec != std::errc() || end != text.data() + text.size() || bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvMaxMessageBytes, "='", std::string(text.substr(0, 40)), "' is not a positive number of bytes"));
  }
  limits.max_payload_size = bytes;
  return limits;
}

absl::StatusOr<v1::Handshake> parse_handshake(const char* body, std::size_t size) {
  v1::Handshake handshake;
  if (!handshake.ParseFromArray(body, static_cast<int>(size)) ||
      handshake.step_case() == v1::Handshake::STEP_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat("malformed handshake frame (", size, " bytes)"));
  }
  return handshake;
}

}  // namespace castmesh::wire
