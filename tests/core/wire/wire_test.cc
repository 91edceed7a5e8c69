#include <gtest/gtest.h>

#include "core/wire/frame.h"
#include "core/wire/handshake.h"
#include "core/wire/payload.h"
#include "core/wire/status_code.h"

namespace castmesh::wire {
namespace {

TEST(Frame, RoundTripsAFrameHeader) {
  v1::FrameHeader frame_header;
  frame_header.set_version(kWireVersion);
  frame_header.set_source("unix:@a/actor[1]");
  frame_header.set_destination("unix:@b/actor[2]");
  frame_header.set_port(7);
  frame_header.set_sequence(42);
  frame_header.set_message_type("demo.Ping");
  frame_header.set_payload_size(3);
  std::string frame;
  append_frame_body(frame_header, frame);
  ASSERT_GE(frame.size(), kLengthPrefixSize);
  const std::uint32_t body = read_length_prefix(frame.data());
  ASSERT_EQ(body + kLengthPrefixSize, frame.size());
  ASSERT_TRUE(check_body_size(body, FrameLimits{}).ok());
  auto parsed = parse_frame_header(frame.data() + kLengthPrefixSize, body, FrameLimits{});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->destination(), "unix:@b/actor[2]");
  EXPECT_EQ(parsed->sequence(), 42u);
  EXPECT_EQ(parsed->message_type(), "demo.Ping");
}

TEST(Frame, RejectsUnknownVersionOversizeAndGarbage) {
  FrameLimits limits;
  limits.max_payload_size = 100;
  v1::FrameHeader frame_header;
  frame_header.set_version(99);
  std::string body = frame_header.SerializeAsString();
  auto bad_version = parse_frame_header(body.data(), body.size(), limits);
  ASSERT_FALSE(bad_version.ok());
  EXPECT_NE(bad_version.status().message().find("unknown wire version 99"), std::string::npos);

  frame_header.set_version(kWireVersion);
  frame_header.set_payload_size(101);
  body = frame_header.SerializeAsString();
  EXPECT_FALSE(parse_frame_header(body.data(), body.size(), limits).ok());

  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
  EXPECT_FALSE(parse_frame_header(garbage.data(), garbage.size(), limits).ok());
  EXPECT_FALSE(check_body_size(0, limits).ok());
  EXPECT_FALSE(check_body_size(limits.max_body_size + 1, limits).ok());
  EXPECT_FALSE(parse_handshake(garbage.data(), garbage.size()).ok());
}

TEST(Frame, ParseMessageTakesAViewAndRefusesWhatProtobufCannotTake) {
  v1::FrameHeader sent;
  sent.set_message_type("demo.Ping");
  sent.set_sequence(9);
  const std::string bytes = sent.SerializeAsString();
  v1::FrameHeader got;
  ASSERT_TRUE(parse_message(bytes, got));
  EXPECT_EQ(got.message_type(), "demo.Ping");
  EXPECT_EQ(got.sequence(), 9u);
  EXPECT_FALSE(parse_message("\xff\xff\xff", got));
  // More than protobuf's int size: refused before anything is read.
  EXPECT_FALSE(parse_message(std::string_view(bytes.data(), std::size_t{1} << 31), got));
}

TEST(Frame, RoundTripsABinaryDataFrame) {
  std::string frame = "x";  // appended after what is there
  append_binary_data_frame(7, 1000, "svc.type", std::string("h\0dr", 4), frame);
  const std::uint32_t prefix = read_length_prefix(frame.data() + 1);
  ASSERT_NE(prefix & kBinaryDataFrameBit, 0u);
  const std::uint32_t body = prefix & ~kBinaryDataFrameBit;
  ASSERT_EQ(1 + kLengthPrefixSize + body, frame.size());
  auto head = parse_binary_data_frame(frame.data() + 1 + kLengthPrefixSize, body, FrameLimits{});
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->sequence, 7u);
  EXPECT_EQ(head->payload_size, 1000u);
  EXPECT_EQ(head->type, "svc.type");
  EXPECT_EQ(head->header, std::string_view("h\0dr", 4));
  // Little-endian on every host: the sequence's low byte comes first.
  EXPECT_EQ(frame[1 + kLengthPrefixSize], '\x07');
}

TEST(Frame, RejectsBinaryDataFramesWhoseSizesTypeOrPayloadAreWrong) {
  FrameLimits limits;
  limits.max_payload_size = 100;
  auto parse = [&](const std::string& frame) {
    const std::uint32_t body = read_length_prefix(frame.data()) & ~kBinaryDataFrameBit;
    return parse_binary_data_frame(frame.data() + kLengthPrefixSize, body, limits);
  };
  std::string frame;
  append_binary_data_frame(1, 101, "t", "", frame);
  EXPECT_NE(parse(frame).status().message().find("exceeds the limit"), std::string::npos) << parse(frame).status();
  frame.clear();
  append_binary_data_frame(1, 0, "bad\ntype", "", frame);
  EXPECT_NE(parse(frame).status().message().find("not printable"), std::string::npos) << parse(frame).status();
  frame.clear();
  append_binary_data_frame(1, 0, "t", "hh", frame);
  frame[kLengthPrefixSize + 20] = 5;  // header_size 5, two bytes there
  EXPECT_NE(parse(frame).status().message().find("claims a type of 1 and a header of 5"), std::string::npos)
      << parse(frame).status();
  frame[kLengthPrefixSize + 16] = static_cast<char>(0xff);  // a type size near 2^32: no overflow
  frame[kLengthPrefixSize + 19] = static_cast<char>(0xff);
  EXPECT_FALSE(parse(frame).ok());
  EXPECT_FALSE(parse_binary_data_frame(frame.data(), kBinaryDataFrameFixedSize - 1, limits).ok());
}

TEST(Handshake, MacsDependOnSecretNoncesAndRole) {
  const std::string a = make_nonce(), c = make_nonce();
  EXPECT_EQ(a.size(), kNonceSize);
  EXPECT_NE(a, c);
  const std::string mac = connector_mac("s3cret", a, c, "unix:@p");
  EXPECT_TRUE(mac_equal(mac, connector_mac("s3cret", a, c, "unix:@p")));
  EXPECT_FALSE(mac_equal(mac, connector_mac("other", a, c, "unix:@p")));
  EXPECT_FALSE(mac_equal(mac, connector_mac("s3cret", c, a, "unix:@p")));
  EXPECT_FALSE(mac_equal(mac, connector_mac("s3cret", a, c, "unix:@q")));
  EXPECT_FALSE(mac_equal(mac, acceptor_mac("s3cret", a, c, "unix:@p")));
  EXPECT_EQ(make_secret().size(), 64u);
}

TEST(Payload, SharesWithoutCopying) {
  std::string big(1 << 20, 'x');
  const char* where = big.data();
  Payload p = Payload::adopt(std::move(big));
  EXPECT_EQ(p.data(), where);
  Payload q = p;
  EXPECT_EQ(q.data(), where);
  EXPECT_EQ(Payload::copy_of("abc").view(), "abc");
}

TEST(Payload, BorrowedBytesAreCopiedOnlyWhenOwnedIsAsked) {
  std::string bytes = "borrowed bytes";
  Payload borrowed = Payload::borrow(bytes);
  EXPECT_TRUE(borrowed.borrowed());
  EXPECT_EQ(borrowed.data(), bytes.data());
  Payload kept = borrowed.owned();
  EXPECT_FALSE(kept.borrowed());
  EXPECT_NE(kept.data(), bytes.data());
  bytes.assign(bytes.size(), '!');
  EXPECT_EQ(kept.view(), "borrowed bytes");
  Payload again = kept.owned();  // owns already: shared, not copied
  EXPECT_EQ(again.data(), kept.data());
}

TEST(StatusFromWire, KnownCodesKeepTheirCodeAndOthersBecomeUnknown) {
  EXPECT_TRUE(status_from_wire(0, "ignored").ok());
  const absl::Status not_found = status_from_wire(static_cast<int>(absl::StatusCode::kNotFound), "no actor x");
  EXPECT_EQ(not_found.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(not_found.message(), "no actor x");
  for (int bad : {-1, 17, 1000}) {
    const absl::Status st = status_from_wire(bad, "odd");
    EXPECT_EQ(st.code(), absl::StatusCode::kUnknown) << bad;
    EXPECT_NE(st.message().find(absl::StrCat("status code ", bad)), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace castmesh::wire
