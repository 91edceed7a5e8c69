// Facts about this process (core/platform/process.h), in the Linux build and
// in the CASTMESH_POSIX_FALLBACKS build (where argv[0] is what finds this
// program again).
#include "core/platform/process.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "castmesh/proc_mesh.h"
#include "core/platform/platform.h"

namespace castmesh::platform {
namespace {

std::vector<std::string> g_argv;  // as given to main

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

TEST(Process, ExecutablePathIsThisProgram) {
  absl::StatusOr<std::string> path = executable_path();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(same_file(*path, g_argv[0])) << *path << " vs " << g_argv[0];
  if (uses_linux_facilities()) {
    EXPECT_EQ(*path, "/proc/self/exe");
  }
}

TEST(Process, CommandLineIsTheOneGivenToInit) { EXPECT_EQ(command_line(), g_argv); }

TEST(Process, EnvironmentIsThisProcesssOne) {
  const char* path = std::getenv("PATH");
  ASSERT_NE(path, nullptr);
  bool found = false;
  for (char** e = environment(); *e != nullptr; ++e) found = found || std::string(*e) == std::string("PATH=") + path;
  EXPECT_TRUE(found);
}

// argv[0] without a '/' is looked up in PATH when the command line is
// recorded; a name found nowhere is a clear error (fallback only: Linux
// asks /proc/self/exe whatever argv[0] says).
TEST(Process, Argv0IsResolvedThroughPathWhereItIsNeeded) {
  std::vector<char*> original;
  for (std::string& a : g_argv) original.push_back(a.data());
  char sh[] = "sh";
  char* by_name[] = {sh};
  record_command_line(1, by_name);
  absl::StatusOr<std::string> found = executable_path();
  char nowhere[] = "castmesh-no-such-program-here";
  char* missing[] = {nowhere};
  record_command_line(1, missing);
  absl::StatusOr<std::string> not_found = executable_path();
  record_command_line(static_cast<int>(original.size()), original.data());

  ASSERT_TRUE(found.ok()) << found.status();
  if (uses_linux_facilities()) {
    EXPECT_EQ(*found, "/proc/self/exe");
    EXPECT_TRUE(not_found.ok());
    return;
  }
  EXPECT_EQ(found->front(), '/') << *found;
  EXPECT_EQ(::access(found->c_str(), X_OK), 0) << *found;
  ASSERT_FALSE(not_found.ok());
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_found.status().message().find("castmesh-no-such-program-here"), std::string::npos)
      << not_found.status();
  EXPECT_NE(not_found.status().message().find("worker_argv"), std::string::npos) << not_found.status();
}

TEST(Process, ThreadNameIsSetWhereTheSystemCan) {
  if (!uses_linux_facilities()) GTEST_SKIP() << "no portable thread-name call: set_current_thread_name is a no-op";
  std::string name;
  std::thread([&] {
    set_current_thread_name("castmesh-a-very-long-name");
    char buffer[32] = {};
    pthread_getname_np(pthread_self(), buffer, sizeof(buffer));
    name = buffer;
  }).join();
  EXPECT_EQ(name, "castmesh-a-very");  // 15 characters kept
}

}  // namespace
}  // namespace castmesh::platform

int main(int argc, char** argv) {
  castmesh::init(argc, argv);
  castmesh::platform::g_argv.assign(argv, argv + argc);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
