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
