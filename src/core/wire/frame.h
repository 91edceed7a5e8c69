// Frame codec of the castmesh wire (proto/castmesh/wire/v1/frame.proto):
//   frame := u32_le(body_size) body [payload]
// Pure functions; callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/wire/v1/frame.pb.h"

namespace castmesh::wire {

// The one wire version this build speaks.
inline constexpr std::uint32_t kWireVersion = 1;
inline constexpr std::size_t kLengthPrefixSize = 4;

// Default largest payload of one message a receiver accepts: far below the
// memory of any machine castmesh runs on, far above a control message. Raise
// it with CASTMESH_MAX_MESSAGE_BYTES (docs/security.md).
inline constexpr std::uint64_t kDefaultMaxPayloadSize = std::uint64_t{1} << 30;  // 1 GiB
// Environment variable that sets FrameLimits::max_payload_size of every
// endpoint that keeps the default (a byte count; docs/security.md).
inline constexpr char kEnvMaxMessageBytes[] = "CASTMESH_MAX_MESSAGE_BYTES";

// What a receiver accepts; anything larger closes the connection.
struct FrameLimits {
  std::uint32_t max_body_size = 64 * 1024;                  // frame header or handshake message
  std::uint64_t max_payload_size = kDefaultMaxPayloadSize;  // payload of one frame
};

// `limits` with max_payload_size taken from the settings table
// (max_message_bytes, CASTMESH_MAX_MESSAGE_BYTES) when `limits` has the
// default. InvalidArgument when the environment's settings are not valid
// (config::check_environment: an unknown CASTMESH_ variable, a malformed value).
absl::StatusOr<FrameLimits> apply_environment(FrameLimits limits);

// Parses `bytes` (a service's data header, a serialized handle) into
// `message`. False when they do not parse, or are more than protobuf takes
// (2 GiB). Pure; any thread.
bool parse_message(std::string_view bytes, google::protobuf::MessageLite& message);

// Appends u32_le(size) and the serialized `message` to `out`.
void append_frame_body(const google::protobuf::MessageLite& message, std::string& out);

// Reads a u32 little-endian length prefix at `p` (kLengthPrefixSize bytes).
std::uint32_t read_length_prefix(const char* p);

// InvalidArgument when a body of `size` bytes is not acceptable.
absl::Status check_body_size(std::uint32_t size, const FrameLimits& limits);

// Longest proc id a handshake may carry, and longest address or type name an
// frame header may carry (they end up in logs and error messages).
inline constexpr std::size_t kMaxProcIdSize = 512;
inline constexpr std::size_t kMaxHeaderNameSize = 1024;

// Parses and validates a frame header body: parse errors, an unknown version,
// a payload above the limit, addresses or a type name that are not printable
// UTF-8 (log::is_printable) or longer than kMaxHeaderNameSize, or an
// error_message that is not UTF-8 are InvalidArgument with the reason (the
// peer's text escaped and cut, log::printable).
absl::StatusOr<v1::FrameHeader> parse_frame_header(const char* body, std::size_t size,
                                            const FrameLimits& limits);
// The same, into `frame_header`, whose fields' memory a parse reuses (a
// connection's reader parses every frame into one message: no allocation
// per frame).
absl::Status parse_frame_header_into(const char* body, std::size_t size, const FrameLimits& limits,
                                     v1::FrameHeader& frame_header);

// `flags` bit of a data frame (FrameHeader.data_header): KIND_CONTROL, this
// bit set, bit 1 (a control reply) clear.
inline constexpr std::uint32_t kDataFrameFlag = 2;
inline constexpr std::uint32_t kControlReplyFlag = 1;
// Whether `frame_header` heads a data frame (transport::Endpoint::send_data).
bool is_data_frame(const v1::FrameHeader& frame_header);

// Binary data frames (frame.proto): the length prefix's marker bit and the
// fixed part of the body.
inline constexpr std::uint32_t kBinaryDataFrameBit = 0x80000000u;
inline constexpr std::size_t kBinaryDataFrameFixedSize = 24;

// A data frame's head as the binary form carries it; `type` and `header`
// view the frame's bytes.
struct BinaryDataFrameHead {
  std::uint64_t sequence = 0;
  std::uint64_t payload_size = 0;
  std::string_view type;
  std::string_view header;
};

// Appends a binary data frame's length prefix and body to `out`.
void append_binary_data_frame(std::uint64_t sequence, std::uint64_t payload_size, std::string_view type,
                              std::string_view header, std::string& out);

// Parses a binary data frame's body (the prefix's size with the marker bit
// cleared, already checked against limits.max_body_size): InvalidArgument
// when its sizes disagree, the type is not printable UTF-8 of at most
// kMaxHeaderNameSize bytes, or the payload is above the limit.
absl::StatusOr<BinaryDataFrameHead> parse_binary_data_frame(const char* body, std::size_t size,
                                                            const FrameLimits& limits);

// Sends libprotobuf's own log lines (e.g. about a `string` field that is
// not UTF-8 in a message some peer sent) through castmesh's logger,
// escaped and rate-limited, instead of straight to stderr. Once per process;
// no-op on protobuf versions without SetLogHandler. Any thread.
void route_protobuf_logs();

// Parses a handshake body (no version check here: the step's own field);
// the proc id of a challenge or response must be printable UTF-8 of at most
// kMaxProcIdSize bytes.
absl::StatusOr<v1::Handshake> parse_handshake(const char* body, std::size_t size);

}  // namespace castmesh::wire
