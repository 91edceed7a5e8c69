// Host agents on loopback: the castmesh-host executable as the agent, this
// binary re-executed as the worker procs (castmesh::init in main()), and
// the pure parts (agent addresses, the secret file, CPU binding specs).
// Cross-namespace behaviour is tested in tests/python/test_hosts.py.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "castmesh/actor.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/host_mesh.h"
#include "castmesh/metrics.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "core/host/host_address.h"
#include "core/platform/cpu_binding.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/testing/digits_actor.h"
#include "core/testing/test_messages.h"

namespace {

struct WhereAreYou {};
}  // namespace
CASTMESH_REGISTER_MESSAGE(WhereAreYou, "test.host.WhereAreYou", castmesh::testing::encode_empty,
                          castmesh::testing::decode_empty);

namespace {

// Answers with its pid and its host identity.
class Locator : public castmesh::Actor {
 public:
  std::string where(const WhereAreYou&) {
    return std::to_string(::getpid()) + " " + castmesh::platform::host_identity();
  }
  using Handlers = castmesh::Handlers<&Locator::where>;
};

}  // namespace
CASTMESH_REGISTER_ACTOR(Locator);

namespace {

constexpr char kSecret[] = "host-mesh-test-secret";

TEST(AgentAddress, AcceptsMonarchsAndCastmeshsForms) {
  auto a = castmesh::host::parse_agent_address("tcp://127.0.0.1:26600");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->listen, "tcp:127.0.0.1:26600");
  EXPECT_EQ(a->advertise_host, "");
  auto b = castmesh::host::parse_agent_address("tcp://node7@0.0.0.0:0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->listen, "tcp:0.0.0.0:0");
  EXPECT_EQ(b->advertise_host, "node7");
  auto c = castmesh::host::parse_agent_address("tcp:0.0.0.0:1234");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->advertise_host.empty());  // a wildcard listen advertises something
  EXPECT_EQ(*castmesh::host::agent_dial_address("tcp://node7:26600"), "tcp:node7:26600");
}

TEST(AgentAddress, RefusesWhatCannotBeDialledOrParsed) {
  for (const char* bad : {"unix:@x", "node7:26600", "tcp://@0.0.0.0:1", "tcp://node7"}) {
    EXPECT_EQ(castmesh::host::parse_agent_address(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto wildcard = castmesh::host::agent_dial_address("tcp://0.0.0.0:26600");
  EXPECT_EQ(wildcard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wildcard.status().message().find("every interface"), std::string::npos);
  EXPECT_EQ(castmesh::host::agent_dial_address("tcp://node7:0").status().code(), absl::StatusCode::kInvalidArgument);
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("CASTMESH_SECRET");
    char folder[] = "/tmp/castmesh-secret-XXXXXX";
    ASSERT_NE(::mkdtemp(folder), nullptr);
    folder_ = folder;
    path_ = folder_ + "/secret";
    std::ofstream(path_) << "s3cret\n";
    ::setenv("CASTMESH_SECRET_FILE", path_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("CASTMESH_SECRET_FILE");
    std::remove(path_.c_str());
    ::rmdir(folder_.c_str());
  }
  std::string folder_, path_;
};

TEST_F(SecretFile, A0600FileGivesTheSecretWithoutItsNewline) {
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  auto secret = castmesh::host::resolve_mesh_secret("");
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(*secret, "s3cret");
  EXPECT_EQ(*castmesh::host::resolve_mesh_secret("explicit"), "explicit");
}

TEST_F(SecretFile, AFileOthersCanReadIsRefused) {
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  auto secret = castmesh::host::resolve_mesh_secret("");
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(secret.status().message().find("mode 0644"), std::string::npos) << secret.status();
}

TEST_F(SecretFile, NoSecretAtAllIsRefused) {
  ::unsetenv("CASTMESH_SECRET_FILE");
  auto secret = castmesh::host::resolve_mesh_secret("");
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(secret.status().message().find("never runs without authentication"), std::string::npos);
}

TEST(CpuBinding, SpecsAreCheckedAndSpreadOverTheProcsOfAHost) {
  EXPECT_TRUE(castmesh::platform::check_proc_bind("").ok());
  EXPECT_TRUE(castmesh::platform::check_proc_bind("cores").ok());
  EXPECT_TRUE(castmesh::platform::check_proc_bind("0-3;4-7").ok());
  EXPECT_EQ(castmesh::platform::check_proc_bind("0-3;x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(castmesh::platform::check_proc_bind("3-1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(castmesh::platform::cpu_binding_for("0-3;4-7", 3), "4-7");
  EXPECT_EQ(castmesh::platform::cpu_binding_for("", 3), "");
  EXPECT_FALSE(castmesh::platform::cpu_binding_for("cores", 0).empty());
}

// A castmesh-host process on loopback; its address read from its first line.
class Agent {
 public:
  explicit Agent(const char* address = "tcp://127.0.0.1:0", std::vector<std::string> extra_args = {}) {
    std::vector<std::string> args = {"castmesh-host", "--address", address};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int out[2];
    EXPECT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::setenv("CASTMESH_SECRET", kSecret, 1);
      ::execv(CASTMESH_HOST_BINARY, argv.data());
      std::_Exit(127);
    }
    ::close(out[1]);
    FILE* lines = ::fdopen(out[0], "r");
    char line[256] = {0};
    if (std::fgets(line, sizeof(line), lines) != nullptr) {
      std::string text(line);
      address_ = text.substr(text.rfind(' ') + 1);
      while (!address_.empty() && address_.back() == '\n') address_.pop_back();
    }
    std::fclose(lines);
  }
  ~Agent() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // Waits up to 10 s for the agent to exit.
  bool exited() {
    for (int i = 0; i < 100 && pid_ > 0; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return true;
      }
      ::usleep(100000);
    }
    return pid_ == 0;
  }

 private:
  pid_t pid_ = 0;
  std::string address_;
};

TEST(HostMesh, AttachSpawnAskAndShutdownOverLoopback) {
  Agent first, second;
  ASSERT_FALSE(first.address().empty());
  ASSERT_FALSE(second.address().empty());
  castmesh::Runtime runtime;
  castmesh::HostMeshOptions options;
  options.secret = kSecret;
  options.name = "host_mesh_test";
  auto hosts = castmesh::HostMesh::attach(runtime, {first.address(), second.address()}, options);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ(hosts->hosts()[1].address, second.address());
  auto procs = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 2}}));
  ASSERT_TRUE(procs.ok()) << procs.status();
  EXPECT_EQ(procs->shape().to_string(), "{hosts=2, procs=2}");
  auto locators = procs->spawn<Locator>("locator");
  ASSERT_TRUE(locators.ok()) << locators.status();
  for (size_t i = 0; i < locators->size(); ++i) {
    auto where = (*locators)[i].ask(WhereAreYou{}).get(absl::Seconds(30));
    ASSERT_TRUE(where.ok()) << where.status();
    EXPECT_EQ(where->substr(where->find(' ') + 1), hosts->hosts()[i / 2].host_identity)
        << "a proc carries its agent's host identity";
    EXPECT_EQ(std::to_string(procs->proc(i).pid), where->substr(0, where->find(' ')));
  }
  // A second controller is refused, naming the first.
  castmesh::Runtime other;
  castmesh::HostMeshOptions other_options = options;
  other_options.name = "intruder";
  other_options.attach_timeout = absl::Seconds(10);
  auto refused = castmesh::HostMesh::attach(other, {first.address()}, other_options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("is attached to controller 'host_mesh_test'"), std::string::npos)
      << refused.status();
  // A read-only observer is accepted beside the controller and reads the
  // agent's metrics and its peers' (docs/observability.md, "castmesh top").
  {
    auto observer = castmesh::metrics::Observer::connect(first.address(), kSecret, "host_mesh_test observer",
                                                         absl::Seconds(10));
    ASSERT_TRUE(observer.ok()) << observer.status();
    auto seen = (*observer)->metrics(absl::Seconds(10));
    ASSERT_TRUE(seen.ok()) << seen.status();
    ASSERT_GE(seen->size(), 2u);  // the agent, then at least its controller
    for (const auto& p : *seen) EXPECT_TRUE(p.status.ok()) << p.proc_id << ": " << p.status;
  }
  // A wrong secret never gets an answer.
  castmesh::Runtime stranger;
  castmesh::HostMeshOptions wrong = options;
  wrong.secret = "not-the-secret";
  wrong.attach_timeout = absl::Seconds(10);
  EXPECT_FALSE(castmesh::HostMesh::attach(stranger, {second.address()}, wrong).ok());

  EXPECT_TRUE(procs->stop().ok());
  EXPECT_TRUE(hosts->shutdown().ok());
  EXPECT_TRUE(first.exited());
  EXPECT_TRUE(second.exited());
  auto after = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 1}}));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Two "hosts" on one machine: the agents (and so their procs) at two
// loopback addresses, which are two hosts to the cast tree.
TEST(HostMesh, ACastCrossesTheNetworkOncePerHost) {
  Agent first("tcp://127.0.0.1:0"), second("tcp://127.0.0.2:0");
  ASSERT_FALSE(first.address().empty());
  ASSERT_FALSE(second.address().empty());
  castmesh::Runtime runtime;
  castmesh::HostMeshOptions options;
  options.secret = kSecret;
  auto hosts = castmesh::HostMesh::attach(runtime, {first.address(), second.address()}, options);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  auto procs = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 3}}));
  ASSERT_TRUE(procs.ok()) << procs.status();
  castmesh::MeshOptions mesh_options;
  mesh_options.name = "digits";
  mesh_options.fanout = 16;  // >= 6 procs: without hosts the controller would message each proc
  auto mesh = castmesh::ActorMesh<castmesh::testing::Digits>::Spawn(*procs, mesh_options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->call(castmesh::testing::Get{}).get(absl::Seconds(20)).ok());  // connections are up
  auto host = castmesh::proc::ProcHost::of(runtime);
  const uint64_t before = host->messages_sent();
  ASSERT_TRUE(mesh->cast(castmesh::testing::Add{1}).ok());
  EXPECT_EQ(host->messages_sent() - before, 2u) << "one message per host, the hosts' first procs fan out";
  auto values = mesh->call(castmesh::testing::Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(values.ok()) << values.status();
  for (const auto& [point, v] : values->items()) EXPECT_EQ(v, 1) << point;
  EXPECT_TRUE(procs->stop().ok());
  EXPECT_TRUE(hosts->shutdown().ok());
}

TEST(HostMesh, AFrozenAgentIsLostAfterTheMeshsOwnHeartbeatTimeout) {
  Agent agent;
  ASSERT_FALSE(agent.address().empty());
  castmesh::Runtime runtime;
  castmesh::HostMeshOptions options;
  options.secret = kSecret;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.heartbeat_timeout = absl::Milliseconds(800);
  auto hosts = castmesh::HostMesh::attach(runtime, {agent.address()}, options);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  // A frozen machine: the agent stops answering without closing anything.
  ASSERT_EQ(::kill(agent.pid(), SIGSTOP), 0);
  const absl::Time start = absl::Now();
  auto procs = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 1}}));
  const absl::Duration took = absl::Now() - start;
  ::kill(agent.pid(), SIGCONT);
  ASSERT_FALSE(procs.ok());
  EXPECT_NE(procs.status().message().find(agent.address()), std::string::npos) << procs.status();
  // The mesh's 0.8 s heartbeat, not the 30 s attach timeout (generous slack for a busy machine).
  EXPECT_LT(took, absl::Seconds(15)) << procs.status();
}

TEST(HostMesh, IncompleteTlsCredentialsAreRefusedSayingWhatIsMissing) {
  castmesh::Runtime runtime;
  castmesh::HostMeshOptions options;
  options.ca = "ca.pem";
  auto attached = castmesh::HostMesh::attach(runtime, {"tcp://127.0.0.1:1"}, options);
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(attached.status().message().find("private key"), std::string::npos) << attached.status();
  castmesh::HostAgentOptions agent;
  agent.address = "tcp://127.0.0.1:0";
  agent.private_key = "key.pem";
  const absl::Status run = castmesh::run_host_agent(agent);
  EXPECT_EQ(run.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.message().find("trust_all_connections"), std::string::npos) << run;
}

// Test certificates (scripts/make-test-certs.sh) in a fresh folder, removed
// at the end; empty dir() when the openssl command is missing.
class TestCerts {
 public:
  TestCerts() {
    if (std::system("openssl version >/dev/null 2>&1") != 0) return;
    char dir_template[] = "/tmp/castmesh-host-certs-XXXXXX";
    dir_ = ::mkdtemp(dir_template);
    if (std::system((std::string(CASTMESH_MAKE_TEST_CERTS) + " " + dir_ + " agent controller >/dev/null").c_str()) !=
        0) {
      dir_.clear();
    }
  }
  ~TestCerts() {
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  const std::string& dir() const { return dir_; }
  std::vector<std::string> agent_args() const {
    return {"--ca", dir_ + "/ca.crt", "--cert", dir_ + "/agent.crt", "--key", dir_ + "/agent.key"};
  }
  castmesh::HostMeshOptions controller_options() const {
    castmesh::HostMeshOptions options;
    options.secret = kSecret;
    options.ca = dir_ + "/ca.crt";
    options.cert = dir_ + "/controller.crt";
    options.private_key = dir_ + "/controller.key";
    options.attach_timeout = absl::Seconds(15);
    return options;
  }

 private:
  std::string dir_;
};

TEST(HostMesh, AttachSpawnAndAskOverMutualTlsAndRefuseAMismatchEitherWay) {
  TestCerts certs;
  if (certs.dir().empty()) GTEST_SKIP() << "the openssl command (for scripts/make-test-certs.sh) is not available";
  Agent tls_agent("tcp://127.0.0.1:0", certs.agent_args());
  Agent plain_agent;
  ASSERT_FALSE(tls_agent.address().empty());
  ASSERT_FALSE(plain_agent.address().empty());
  {
    // TLS controller, TLS agent: its procs (this binary, given the agent's
    // files through CASTMESH_TLS_*) join and answer over TLS.
    castmesh::Runtime runtime;
    auto hosts = castmesh::HostMesh::attach(runtime, {tls_agent.address()}, certs.controller_options());
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    auto procs = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 2}}));
    ASSERT_TRUE(procs.ok()) << procs.status();
    auto locators = procs->spawn<Locator>("locator");
    ASSERT_TRUE(locators.ok()) << locators.status();
    for (size_t i = 0; i < locators->size(); ++i) {
      auto where = (*locators)[i].ask(WhereAreYou{}).get(absl::Seconds(30));
      ASSERT_TRUE(where.ok()) << where.status();
    }
    EXPECT_TRUE(procs->stop().ok());
    // A controller without TLS is refused by the TLS agent...
    castmesh::Runtime plain;
    castmesh::HostMeshOptions plain_options;
    plain_options.secret = kSecret;
    plain_options.attach_timeout = absl::Seconds(15);
    auto refused = castmesh::HostMesh::attach(plain, {tls_agent.address()}, plain_options);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("require TLS"), std::string::npos) << refused.status();
    EXPECT_TRUE(hosts->shutdown().ok());
  }
  // ...and a TLS controller by an agent without it.
  castmesh::Runtime runtime;
  auto refused = castmesh::HostMesh::attach(runtime, {plain_agent.address()}, certs.controller_options());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("speak TLS"), std::string::npos) << refused.status();
  EXPECT_TRUE(tls_agent.exited());
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // the agents' procs never return from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
