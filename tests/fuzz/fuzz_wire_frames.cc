// libFuzzer harness: the frame codec a connection runs over every byte a
// peer sends. The input is read as a connection's byte stream (length
// prefix, handshake or frame header body, payload), as Connection::on_read does,
// through the same functions; every text field let through is passed to
// log::printable, whose output must be one safe log fragment.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/log/log.h"
#include "core/wire/frame.h"

namespace {

namespace wire = castmesh::wire;

// printable() must never let a control character or invalid UTF-8 through.
void check_printable(std::string_view text) {
  const std::string out = castmesh::log::printable(text, 128);
  for (unsigned char c : out) {
    if (c < 0x20 || c == 0x7f) __builtin_trap();
  }
  if (!castmesh::log::is_utf8(out)) __builtin_trap();
  if (castmesh::log::is_printable(text) && text.size() <= 128 && out != text) __builtin_trap();
}

// An error message about peer bytes must already be safe to log as is.
void check_error_text(std::string_view message) {
  for (unsigned char c : message) {
    if (c < 0x20 || c == 0x7f) __builtin_trap();
  }
  if (!castmesh::log::is_utf8(message)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  check_printable(std::string_view(bytes, size));
  wire::FrameLimits limits;
  limits.max_payload_size = 1 << 16;
  bool handshake_done = false;
  std::size_t at = 0;
  while (size - at >= wire::kLengthPrefixSize) {
    const std::uint32_t prefix = wire::read_length_prefix(bytes + at);
    const bool binary = handshake_done && (prefix & wire::kBinaryDataFrameBit) != 0;
    const std::uint32_t body_size = binary ? prefix & ~wire::kBinaryDataFrameBit : prefix;
    if (!wire::check_body_size(body_size, limits).ok()) break;
    if (size - at - wire::kLengthPrefixSize < body_size) break;
    const char* body = bytes + at + wire::kLengthPrefixSize;
    at += wire::kLengthPrefixSize + body_size;
    if (binary) {
      auto head = wire::parse_binary_data_frame(body, body_size, limits);
      if (!head.ok()) {
        check_error_text(std::string(head.status().message()));
        break;
      }
      check_printable(head->type);
      if (head->type.data() + head->type.size() > body + body_size ||
          head->header.data() + head->header.size() != body + body_size) {
        __builtin_trap();  // the views must lie inside the body
      }
      if (head->payload_size > size - at) break;
      at += static_cast<std::size_t>(head->payload_size);
      continue;
    }
    if (!handshake_done) {
      auto handshake = wire::parse_handshake(body, body_size);
      if (!handshake.ok()) {
        check_error_text(std::string(handshake.status().message()));
        break;
      }
      if (handshake->has_challenge()) check_printable(handshake->challenge().proc());
      if (handshake->has_response()) check_printable(handshake->response().proc());
      handshake_done = handshake->has_accept() || handshake->has_response();
      continue;
    }
    auto frame_header = wire::parse_frame_header(body, body_size, limits);
    if (!frame_header.ok()) {
      check_error_text(std::string(frame_header.status().message()));
      break;
    }
    for (const std::string* text : {&frame_header->source(), &frame_header->destination(),
                                    &frame_header->message_type(), &frame_header->reply_to(),
                                    &frame_header->error_message()}) {
      check_printable(*text);
    }
    const std::uint64_t payload = frame_header->payload_size();
    if (payload > size - at) break;
    at += static_cast<std::size_t>(payload);
  }
  return 0;
}
