#include <gtest/gtest.h>

#include "core/transport/address.h"

namespace castmesh::transport {
namespace {

TEST(ChannelAddress, ParsesEveryScheme) {
  auto local = parse_channel_address("local:alpha");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->kind, ChannelAddress::Kind::kLocal);
  EXPECT_EQ(local->to_string(), "local:alpha");

  auto path = parse_channel_address("unix:/tmp/x.sock");
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->abstract);
  EXPECT_EQ(path->name, "/tmp/x.sock");

  auto abstract = parse_channel_address("unix:@cm-1");
  ASSERT_TRUE(abstract.ok());
  EXPECT_TRUE(abstract->abstract);
  EXPECT_EQ(abstract->to_string(), "unix:@cm-1");

  auto v4 = parse_channel_address("tcp:127.0.0.1:8080");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 8080);

  auto v6 = parse_channel_address("tcp:[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->to_string(), "tcp:[::1]:0");
}

TEST(ChannelAddress, RejectsBadUrls) {
  for (const char* bad : {"", "udp:1.2.3.4:5", "local:", "unix:", "unix:@", "tcp:host", "tcp::80",
                          "tcp:::1:80", "tcp:[::1:80", "tcp:h:99999", "tcp:h:8x"}) {
    EXPECT_FALSE(parse_channel_address(bad).ok()) << bad;
  }
  EXPECT_FALSE(parse_channel_address("unix:" + std::string(200, 'p')).ok());
}

TEST(ChannelAddress, UniqueAbstractAddressesDiffer) {
  EXPECT_NE(unique_abstract_unix_address(), unique_abstract_unix_address());
  EXPECT_TRUE(parse_channel_address(unique_abstract_unix_address()).ok());
}

}  // namespace
}  // namespace castmesh::transport
