#include "core/log/log.h"

#include <gtest/gtest.h>

#include <cstdlib>

TEST(Log, LevelComesFromEnvironment) {
  // CTest sets CASTMESH_LOG=debug for this test (see CMakeLists.txt).
  EXPECT_EQ(castmesh::log::logger().level(), spdlog::level::debug);
}
