#include "core/log/log.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

TEST(Log, LevelComesFromEnvironment) {
  // CTest sets CASTMESH_LOG=debug for this test (see CMakeLists.txt).
  EXPECT_EQ(castmesh::log::logger().level(), spdlog::level::debug);
}

TEST(Log, PrintableEscapesControlCharactersAndBadUtf8AndTruncates) {
  using castmesh::log::printable;
  EXPECT_EQ(printable("unix:@castmesh-1-ab"), "unix:@castmesh-1-ab");
  EXPECT_EQ(printable("a\nb\r\t\\"), "a\\nb\\r\\t\\\\");
  EXPECT_EQ(printable("red\x1b[31m"), "red\\x1b[31m");
  EXPECT_EQ(printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(printable("\xc0\x80"), "\\xc0\\x80");          // overlong
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(printable("\xc2\x85"), "\\xc2\\x85");          // C1 control (NEL)
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");          // cut sequence
  const std::string long_text(10000, 'A');
  const std::string cut = printable(long_text, 100);
  EXPECT_EQ(cut, std::string(100, 'A') + "...(10000 bytes)");
  EXPECT_TRUE(castmesh::log::is_printable("tcp:[::1]:5000"));
  EXPECT_FALSE(castmesh::log::is_printable("a\nb"));
  EXPECT_FALSE(castmesh::log::is_printable("\xff"));
  EXPECT_TRUE(castmesh::log::is_utf8("line 1\nline 2 \xc3\xa9"));
  EXPECT_FALSE(castmesh::log::is_utf8("\xff"));
}

TEST(Log, RateLimiterLetsOneLineThroughPerIntervalAndCountsTheRest) {
  castmesh::log::RateLimiter limiter;
  std::uint64_t suppressed = 99;
  ASSERT_TRUE(limiter.allow(&suppressed, 3'600'000'000'000));  // an hour: nothing else gets through
  EXPECT_EQ(suppressed, 0u);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.allow(&suppressed, 3'600'000'000'000));
  castmesh::log::RateLimiter fast;
  ASSERT_TRUE(fast.allow(&suppressed, 0));
  EXPECT_FALSE(limiter.allow(&suppressed));
  ASSERT_TRUE(fast.allow(&suppressed, 0));  // interval 0: always, and nothing was dropped
  EXPECT_EQ(suppressed, 0u);
  EXPECT_EQ(castmesh::log::suppressed_suffix(0), "");
  EXPECT_EQ(castmesh::log::suppressed_suffix(1001), " (1001 more lines like this suppressed)");
}

TEST(Log, LoggingDuringStaticDestructionIsSafe) {
  // The probe's statics log after its logger would have been destroyed (a
  // heap-use-after-free under ASan, a crash or nothing without it).
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> env_strings = {"CASTMESH_LOG=debug"};
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("CASTMESH_LOG=")) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string probe = CASTMESH_LOG_AT_EXIT_PROBE;
  char* argv[] = {probe.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, probe.c_str(), &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) != 0;) {
    if (n > 0) output.append(buf, static_cast<std::size_t>(n));
    if (n < 0 && errno != EINTR) break;
  }
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "probe ended with status " << status << ":\n" << output;
  EXPECT_NE(output.find("logged during static destruction"), std::string::npos) << output;
  EXPECT_NE(output.find("castmesh-proc local:log-at-exit: endpoint down"), std::string::npos) << output;
}
