#include "castmesh/version.h"

#include <gtest/gtest.h>

#include <string>

TEST(Version, LibraryMatchesHeaders) {
  EXPECT_EQ(std::string(castmesh::version()), CASTMESH_VERSION_STRING);
}
