#include "core/wire/frame.h"

#include <google/protobuf/stubs/common.h>

#include <charconv>
#include <cstring>
#include <limits>
#include <mutex>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "core/log/log.h"

#if GOOGLE_PROTOBUF_VERSION < 4022000
#include <google/protobuf/stubs/logging.h>
#define CASTMESH_PROTOBUF_LOG_HANDLER 1
#endif

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

bool parse_message(std::string_view bytes, google::protobuf::MessageLite& message) {
  return bytes.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()) &&
         message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
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

namespace {

// InvalidArgument unless `value` is printable UTF-8 of at most `max` bytes.
absl::Status check_name(const char* what, const std::string& value, std::size_t max) {
  if (value.size() <= max && log::is_printable(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is not printable UTF-8 of at most ", max, " bytes: \"",
                                                 log::printable(value, 64), "\""));
}

absl::Status check_header_text(const v1::FrameHeader& frame_header) {
  using Field = std::pair<const char*, const std::string*>;
  for (const auto& [what, value] : {Field{"frame header source", &frame_header.source()},
                                    {"frame header destination", &frame_header.destination()},
                                    {"frame header message type", &frame_header.message_type()},
                                    {"frame header reply address", &frame_header.reply_to()}}) {
    if (absl::Status st = check_name(what, *value, kMaxHeaderNameSize); !st.ok()) return st;
  }
  if (!log::is_utf8(frame_header.error_message())) {
    return absl::InvalidArgumentError(absl::StrCat("frame header error message is not UTF-8: \"",
                                                   log::printable(frame_header.error_message(), 64), "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::FrameHeader> parse_frame_header(const char* body, std::size_t size,
                                            const FrameLimits& limits) {
  v1::FrameHeader frame_header;
  if (absl::Status st = parse_frame_header_into(body, size, limits, frame_header); !st.ok()) return st;
  return frame_header;
}

bool is_data_frame(const v1::FrameHeader& frame_header) {
  return frame_header.kind() == v1::FrameHeader::KIND_CONTROL && (frame_header.flags() & kDataFrameFlag) != 0 &&
         (frame_header.flags() & kControlReplyFlag) == 0;
}

absl::Status parse_frame_header_into(const char* body, std::size_t size, const FrameLimits& limits,
                                     v1::FrameHeader& frame_header) {
  if (!parse_message(std::string_view(body, size), frame_header)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed frame header (", size, " bytes)"));
  }
  if (frame_header.version() != kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unknown wire version ", frame_header.version(),
                                                   " (this proc speaks ", kWireVersion, ")"));
  }
  if (frame_header.payload_size() > limits.max_payload_size) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", frame_header.payload_size(),
                                                   " bytes exceeds the limit of ",
                                                   limits.max_payload_size));
  }
  return check_header_text(frame_header);
}

namespace {

void put_le(unsigned char* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::uint64_t get_le(const char* p, int bytes) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{u[i]} << (8 * i);
  return v;
}

}  // namespace

void append_binary_data_frame(std::uint64_t sequence, std::uint64_t payload_size, std::string_view type,
                              std::string_view header, std::string& out) {
  const std::size_t body = kBinaryDataFrameFixedSize + type.size() + header.size();
  const std::size_t at = out.size();
  out.resize(at + kLengthPrefixSize + body);
  auto* p = reinterpret_cast<unsigned char*>(out.data() + at);
  put_le(p, kBinaryDataFrameBit | static_cast<std::uint32_t>(body), 4);
  put_le(p + 4, sequence, 8);
  put_le(p + 12, payload_size, 8);
  put_le(p + 20, type.size(), 4);
  put_le(p + 24, header.size(), 4);
  std::memcpy(p + kLengthPrefixSize + kBinaryDataFrameFixedSize, type.data(), type.size());
  std::memcpy(p + kLengthPrefixSize + kBinaryDataFrameFixedSize + type.size(), header.data(), header.size());
}

absl::StatusOr<BinaryDataFrameHead> parse_binary_data_frame(const char* body, std::size_t size,
                                                            const FrameLimits& limits) {
  if (size < kBinaryDataFrameFixedSize) {
    return absl::InvalidArgumentError(absl::StrCat("binary data frame of ", size, " bytes is shorter than its head"));
  }
  BinaryDataFrameHead head;
  head.sequence = get_le(body, 8);
  head.payload_size = get_le(body + 8, 8);
  const std::uint64_t type_size = get_le(body + 16, 4);
  const std::uint64_t header_size = get_le(body + 20, 4);
  if (kBinaryDataFrameFixedSize + type_size + header_size != size) {
    return absl::InvalidArgumentError(absl::StrCat("binary data frame of ", size, " bytes claims a type of ",
                                                   type_size, " and a header of ", header_size, " bytes"));
  }
  if (head.payload_size > limits.max_payload_size) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", head.payload_size, " bytes exceeds the limit of ",
                                                   limits.max_payload_size));
  }
  head.type = std::string_view(body + kBinaryDataFrameFixedSize, type_size);
  head.header = std::string_view(body + kBinaryDataFrameFixedSize + type_size, header_size);
  if (head.type.size() > kMaxHeaderNameSize || !log::is_printable(head.type)) {
    return absl::InvalidArgumentError(absl::StrCat("binary data frame type is not printable UTF-8 of at most ",
                                                   kMaxHeaderNameSize, " bytes: \"", log::printable(head.type, 64),
                                                   "\""));
  }
  return head;
}

absl::StatusOr<FrameLimits> apply_environment(FrameLimits limits) {
  // Every endpoint starts here: the check of the whole settings table is this process's start-up error.
  if (absl::Status settings = config::check_environment(); !settings.ok()) return settings;
  if (limits.max_payload_size == kDefaultMaxPayloadSize) limits.max_payload_size = config::global().max_message_bytes;
  return limits;
}

void route_protobuf_logs() {
#if CASTMESH_PROTOBUF_LOG_HANDLER
  static std::once_flag once;
  std::call_once(once, [] {
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char* file, int line, const std::string& message) {
          CASTMESH_LOG_WARN_LIMITED("libprotobuf ({}:{}): {}", file != nullptr ? file : "?", line,
                                    log::printable(message));
        });
  });
#endif
}

absl::StatusOr<v1::Handshake> parse_handshake(const char* body, std::size_t size) {
  v1::Handshake handshake;
  if (!parse_message(std::string_view(body, size), handshake) ||
      handshake.step_case() == v1::Handshake::STEP_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat("malformed handshake frame (", size, " bytes)"));
  }
  if (handshake.has_challenge()) {
    if (absl::Status st = check_name("challenge proc id", handshake.challenge().proc(), kMaxProcIdSize); !st.ok()) {
      return st;
    }
  }
  if (handshake.has_response()) {
    if (absl::Status st = check_name("response proc id", handshake.response().proc(), kMaxProcIdSize); !st.ok()) {
      return st;
    }
  }
  return handshake;
}

}  // namespace castmesh::wire
