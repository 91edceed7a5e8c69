// CastTable's groups and the sender's first split (src/core/mesh/cast_relay.h):
// one span per host when a mesh's procs are on several hosts.
#include <gtest/gtest.h>

#include "core/mesh/cast_relay.h"

namespace castmesh::mesh {
namespace {

// A mesh of one member per proc, procs given by their ids.
CastTable table_of(const std::vector<std::string>& procs) {
  std::vector<Address> members;
  for (size_t i = 0; i < procs.size(); ++i) {
    absl::StatusOr<Address> a = Address::parse(procs[i] + "/m[" + std::to_string(i) + "]");
    EXPECT_TRUE(a.ok()) << a.status();
    members.push_back(*a);
  }
  absl::StatusOr<CastTable> t =
      CastTable::Build("tcp:10.0.0.1:1", 1, "m", *Shape::Create({{"procs", procs.size()}}), members);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

TEST(CastTable, ProcsOnSeveralHostsGetOneRootSpanPerHost) {
  CastTable t = table_of({"tcp:10.0.0.2:7", "tcp:10.0.0.2:8", "tcp:10.0.0.2:9", "tcp:node-b:7", "tcp:node-b:8",
                          "tcp:[fd00::3]:7"});
  ASSERT_EQ(t.host_spans.size(), 3u);
  EXPECT_EQ(t.root_children(16), (std::vector<CastSpan>{{0, 3}, {3, 5}, {5, 6}}));
  // More hosts than the fan-out: whole hosts per span.
  EXPECT_EQ(t.root_children(2), (std::vector<CastSpan>{{0, 5}, {5, 6}}));
}

TEST(CastTable, OneHostOrInterleavedHostsKeepThePositionalSplit) {
  CastTable local = table_of({"unix:@a", "unix:@b", "unix:@c"});
  EXPECT_TRUE(local.host_spans.empty());
  EXPECT_EQ(local.root_children(2), cast_root_children(3, 2));
  CastTable interleaved = table_of({"tcp:10.0.0.2:7", "tcp:10.0.0.3:7", "tcp:10.0.0.2:8"});
  EXPECT_TRUE(interleaved.host_spans.empty());
  EXPECT_EQ(interleaved.root_children(8), cast_root_children(3, 8));
}

}  // namespace
}  // namespace castmesh::mesh
