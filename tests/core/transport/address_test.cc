#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/platform/platform.h"
#include "core/transport/address.h"
#include "core/transport/unix_socket_names.h"

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

TEST(ChannelAddress, TooLongUnixPathSaysTheLimit) {
  const size_t limit = sizeof(sockaddr_un{}.sun_path) - 1;
  EXPECT_TRUE(parse_channel_address("unix:/" + std::string(limit - 1, 'p')).ok());
  auto too_long = parse_channel_address("unix:/" + std::string(limit, 'p'));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find(absl::StrCat("at most ", limit)), std::string::npos) << too_long.status();
  EXPECT_NE(too_long.status().message().find("sun_path"), std::string::npos) << too_long.status();
  auto abstract_too_long = parse_channel_address("unix:@" + std::string(limit + 1, 'a'));
  ASSERT_FALSE(abstract_too_long.ok());
  EXPECT_NE(abstract_too_long.status().message().find("abstract socket name"), std::string::npos);
}

TEST(ChannelAddress, UniqueAbstractAddressesDiffer) {
  EXPECT_NE(unique_abstract_unix_address(), unique_abstract_unix_address());
  EXPECT_TRUE(parse_channel_address(unique_abstract_unix_address()).ok());
}

// The default Unix address of a proc: abstract where the system has such
// names, else a socket file in this user's private folder.
TEST(UnixSocketNames, DefaultListenAddressFitsThePlatform) {
  EXPECT_EQ(abstract_unix_sockets_supported(), platform::uses_linux_facilities());
  absl::StatusOr<std::string> a = unique_unix_listen_address();
  absl::StatusOr<std::string> b = unique_unix_listen_address();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_NE(*a, *b);
  absl::StatusOr<ChannelAddress> parsed = parse_channel_address(*a);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->kind, ChannelAddress::Kind::kUnix);
  EXPECT_EQ(parsed->abstract, abstract_unix_sockets_supported());
  if (!parsed->abstract) {
    absl::StatusOr<std::string> folder = private_socket_folder();
    ASSERT_TRUE(folder.ok()) << folder.status();
    EXPECT_EQ(parsed->name.rfind(*folder + "/", 0), 0u) << parsed->name;
  }
}

class PrivateSocketFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "castmesh-folder-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    leaf_ = absl::StrCat(base_, "/castmesh-", ::geteuid());
  }
  void TearDown() override {
    ::unlink(leaf_.c_str());  // when a test left a file or link there
    ::rmdir(leaf_.c_str());
    ::rmdir(base_.c_str());
  }
  std::string base_, leaf_;
};

TEST_F(PrivateSocketFolder, IsCreatedWithMode0700) {
  absl::StatusOr<std::string> folder = private_socket_folder_in({base_});
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(*folder, leaf_);
  struct stat st {};
  ASSERT_EQ(::lstat(leaf_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  // Again: the existing private folder is accepted.
  EXPECT_TRUE(private_socket_folder_in({base_}).ok());
}

// Binds a Unix socket file at `path`; the socket is left listening or closed
// (a stale file, as a killed proc leaves).
int bind_socket_file(const std::string& path, bool keep_listening) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  if (keep_listening) return fd;
  ::close(fd);
  return 0;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST_F(PrivateSocketFolder, RemovesOnlyTheSocketsOfDeadProcs) {
  ASSERT_EQ(::mkdir(leaf_.c_str(), 0700), 0);
  const std::string dead = leaf_ + "/999999999-0a1b2c3d4e5f";  // above any pid_max
  const std::string live = absl::StrCat(leaf_, "/", ::getpid(), "-live");
  const std::string other = leaf_ + "/not-a-pid";
  ASSERT_EQ(bind_socket_file(dead, false), 0);
  const int live_fd = bind_socket_file(live, true);
  ASSERT_GE(live_fd, 0);
  ASSERT_EQ(bind_socket_file(other, false), 0);
  ASSERT_TRUE(private_socket_folder_in({base_}).ok());
  EXPECT_FALSE(exists(dead));
  EXPECT_TRUE(exists(live));
  EXPECT_TRUE(exists(other));
  ::close(live_fd);
  ::unlink(live.c_str());
  ::unlink(other.c_str());
}

TEST_F(PrivateSocketFolder, RefusesAFolderOthersCanEnter) {
  ASSERT_EQ(::mkdir(leaf_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(leaf_.c_str(), 0755), 0);
  absl::StatusOr<std::string> folder = private_socket_folder_in({base_});
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("not a private folder"), std::string::npos) << folder.status();
  EXPECT_NE(folder.status().message().find("0755"), std::string::npos) << folder.status();
}

TEST_F(PrivateSocketFolder, RefusesASymlink) {
  ASSERT_EQ(::symlink(base_.c_str(), leaf_.c_str()), 0);
  absl::StatusOr<std::string> folder = private_socket_folder_in({base_});
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("not a folder"), std::string::npos) << folder.status();
}

TEST_F(PrivateSocketFolder, SkipsABaseTooLongForSocketPaths) {
  const std::string long_base = "/" + std::string(sizeof(sockaddr_un{}.sun_path), 'x');
  absl::StatusOr<std::string> folder = private_socket_folder_in({long_base, base_});
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(*folder, leaf_);
  absl::StatusOr<std::string> none = private_socket_folder_in({long_base});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("too long"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace castmesh::transport
