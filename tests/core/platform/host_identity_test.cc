// host_identity(): the one identity every same-host decision compares
// (shared memory, single copy, pid-based paths). Procs of one host must agree
// on it; a host agent's procs carry the agent's ($CASTMESH_HOST_IDENTITY);
// and two network namespaces of one machine (namespace hosts) must differ,
// or their procs would take same-host paths to each other. Each identity is
// computed by a fresh process, as a proc computes its own once. (End to end, across host agents in network
// namespaces: tests/python/hosts, scenario_everything.)
//
// Each identity is computed in a forked child (no exec: under qemu-user
// /proc/self/exe is the emulator), which is a fresh computation because
// host_identity() caches per process and this test process never calls it.
#include "core/platform/process_memory.h"

#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace castmesh::platform {
namespace {

struct Printed {
  std::string identity;            // host_identity()
  std::string namespace_identity;  // namespace_host_identity()
};

enum class Netns { kSame, kNew };

// Computes both identities in a child process with $CASTMESH_HOST_IDENTITY
// set to `configured` (unset when empty), in a new network namespace when
// `netns` says so. Returns nullopt with `*why` set when the namespace cannot
// be made (not root).
std::optional<Printed> identity_of_a_new_process(const std::string& configured, Netns netns, std::string* why) {
  int out[2];
  if (::pipe(out) != 0) {
    *why = std::strerror(errno);
    return std::nullopt;
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(out[0]);
#if defined(__linux__)
    if (netns == Netns::kNew && ::unshare(CLONE_NEWNET) != 0) {
      const std::string message = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
      (void)!::write(out[1], message.data(), message.size());
      ::_exit(3);
    }
#endif
    if (configured.empty()) {
      ::unsetenv(kEnvHostIdentity);
    } else {
      ::setenv(kEnvHostIdentity, configured.c_str(), 1);
    }
    const std::string printed = host_identity() + "\n" + namespace_host_identity();
    const bool written = ::write(out[1], printed.data(), printed.size()) == static_cast<ssize_t>(printed.size());
    ::_exit(written ? 0 : 4);
  }
  ::close(out[1]);
  std::string text;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(out[0], buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *why = text.empty() ? std::string("the child failed (status ") + std::to_string(status) + ")" : text;
    return std::nullopt;
  }
  const size_t newline = text.find('\n');
  if (newline == std::string::npos) {
    *why = "unexpected output: " + text;
    return std::nullopt;
  }
  return Printed{text.substr(0, newline), text.substr(newline + 1)};
}

TEST(HostIdentity, ProcsOfOneHostAgree) {
  std::string why;
  std::optional<Printed> first = identity_of_a_new_process("", Netns::kSame, &why);
  ASSERT_TRUE(first.has_value()) << why;
  std::optional<Printed> second = identity_of_a_new_process("", Netns::kSame, &why);
  ASSERT_TRUE(second.has_value()) << why;
  EXPECT_FALSE(first->identity.empty());
  EXPECT_EQ(first->identity, second->identity);
  EXPECT_EQ(first->identity, first->namespace_identity) << "unset $CASTMESH_HOST_IDENTITY: the namespaces decide";
  EXPECT_EQ(first->namespace_identity, namespace_host_identity()) << "and this process is in the same ones";
}

// What a host agent does for the procs it starts: its identity (given on its
// command line or its own namespaces') reaches them through the environment.
TEST(HostIdentity, TheEnvironmentOverridesTheNamespaces) {
  std::string why;
  std::optional<Printed> printed = identity_of_a_new_process("agent-7", Netns::kSame, &why);
  ASSERT_TRUE(printed.has_value()) << why;
  EXPECT_EQ(printed->identity, "agent-7");
  EXPECT_EQ(printed->namespace_identity, namespace_host_identity()) << "the namespaces' own is unchanged";
}

// Two namespace hosts on one machine share the boot and the pid namespace:
// only the network namespace tells them apart, and it must.
TEST(HostIdentity, AnotherNetworkNamespaceIsAnotherHost) {
#if !defined(__linux__)
  GTEST_SKIP() << "network namespaces are Linux's";
#else
  std::string why;
  std::optional<Printed> here = identity_of_a_new_process("", Netns::kSame, &why);
  ASSERT_TRUE(here.has_value()) << why;
  std::optional<Printed> there = identity_of_a_new_process("", Netns::kNew, &why);
  if (!there.has_value()) {
    const char* required = std::getenv("CASTMESH_REQUIRE_NETNS");
    if (::geteuid() != 0 && (required == nullptr || std::string(required) != "1")) {
      GTEST_SKIP() << "a new network namespace needs root: " << why;
    }
    FAIL() << "cannot make a network namespace: " << why;
  }
  EXPECT_NE(here->identity, there->identity) << "two namespace hosts would take same-host paths to each other";
  // The same boot and pid namespace (the parts before the network namespace).
  EXPECT_EQ(here->identity.substr(0, here->identity.rfind('/')), there->identity.substr(0, there->identity.rfind('/')));
#endif
}

}  // namespace
}  // namespace castmesh::platform
