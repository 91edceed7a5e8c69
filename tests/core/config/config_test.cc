// The settings table (castmesh/config.h, src/core/config): parsing valid,
// malformed and unknown settings, the runtime layer, and what procs started
// afterwards inherit.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "core/config/settings.h"
#include "core/host/host_address.h"
#include "core/platform/cpu_binding.h"
#include "core/platform/process_memory.h"
#include "core/proc/controller_lifeline.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/wire/frame.h"
#include "gtest/gtest.h"

namespace castmesh::config {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

absl::StatusOr<Config> parse(const Env& env) { return parse_environment(lookup(env)); }

// The message of a failed parse of `env` (fails the test when it parsed).
std::string parse_error(const Env& env) {
  absl::StatusOr<Config> config = parse(env);
  EXPECT_FALSE(config.ok()) << "parsed: " << env.begin()->first;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(Config, NothingSetGivesTheDefaults) {
  absl::StatusOr<Config> config = parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  const Config defaults;
  for (const Setting& setting : settings()) {
    EXPECT_EQ(*value_text(*config, setting.key), *value_text(defaults, setting.key)) << setting.key;
    EXPECT_EQ(*value_text(defaults, setting.key), setting.default_text) << setting.key;
  }
  EXPECT_EQ(config->shm_spin, absl::Milliseconds(1));
  EXPECT_EQ(config->socket_spin, absl::Microseconds(200));
  EXPECT_EQ(config->rdma_chunk_bytes, uint64_t{1} << 20);
  EXPECT_FALSE(config->shm_spin_oversubscribed.has_value());
}

TEST(Config, ValidValuesOfEveryKind) {
  absl::StatusOr<Config> config = parse({{"CASTMESH_SHM", "0"},
                                         {"CASTMESH_SINGLE_COPY", "false"},
                                         {"CASTMESH_SOCKET_WAIT", "Off"},
                                         {"CASTMESH_SOCKET_IO_DEFER", "yes"},
                                         {"CASTMESH_SHM_SPIN_US", "0"},
                                         {"CASTMESH_SHM_SPIN_OVERSUBSCRIBED_US", "50"},
                                         {"CASTMESH_SHM_SPIN_YIELD", "1"},
                                         {"CASTMESH_SOCKET_SPIN_US", "100000"},
                                         {"CASTMESH_REDUCTION_ISA", "portable"},
                                         {"CASTMESH_MAX_MESSAGE_BYTES", "2048"},
                                         {"CASTMESH_HEARTBEAT_INTERVAL_MS", "100"},
                                         {"CASTMESH_HEARTBEAT_TIMEOUT_MS", "900"},
                                         {"CASTMESH_RDMA_FALLBACK", "error"},
                                         {"CASTMESH_RDMA_CHUNK_BYTES", "4096"},
                                         {"CASTMESH_RDMA_DEVICE", "mlx5_1"},
                                         {"CASTMESH_RDMA_PORT", "2"},
                                         {"CASTMESH_RDMA_GID_INDEX", "3"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->shm);
  EXPECT_FALSE(config->single_copy);
  EXPECT_FALSE(config->socket_wait);
  EXPECT_TRUE(config->socket_io_defer);
  EXPECT_EQ(config->shm_spin, absl::ZeroDuration());
  EXPECT_EQ(config->shm_spin_oversubscribed, absl::Microseconds(50));
  EXPECT_EQ(config->shm_spin_yield, SpinYield::kYield);
  EXPECT_EQ(config->socket_spin, absl::Milliseconds(100));
  EXPECT_EQ(config->reduction_isa, ReductionIsa::kPortable);
  EXPECT_EQ(config->max_message_bytes, 2048u);
  EXPECT_EQ(config->heartbeat_interval, absl::Milliseconds(100));
  EXPECT_EQ(config->heartbeat_timeout, absl::Milliseconds(900));
  EXPECT_EQ(config->rdma_fallback, RdmaFallback::kError);
  EXPECT_EQ(config->rdma_chunk_bytes, 4096u);
  EXPECT_EQ(config->rdma_device, "mlx5_1");
  EXPECT_EQ(config->rdma_port, 2u);
  EXPECT_EQ(config->rdma_gid_index, 3u);
  EXPECT_EQ(*value_text(*config, "shm_spin_yield"), "1");
  EXPECT_EQ(*value_text(*config, "shm_spin_oversubscribed_us"), "50");
  EXPECT_EQ(*value_text(*config, "single_copy"), "0");
  EXPECT_EQ(parse({{"CASTMESH_SHM_SPIN_YIELD", "0"}})->shm_spin_yield, SpinYield::kPause);
  EXPECT_EQ(parse({{"CASTMESH_SHM_SPIN_YIELD", "auto"}})->shm_spin_yield, SpinYield::kAuto);
}

TEST(Config, AnEmptyValueMeansUnset) {  // launchers and shells export empty variables
  absl::StatusOr<Config> config = parse({{"CASTMESH_SHM", ""}, {"CASTMESH_SHM_SPIN_US", ""}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->shm);
  EXPECT_EQ(config->shm_spin, absl::Milliseconds(1));
}

TEST(Config, MalformedValuesAreErrorsNamingTheVariableAndValue) {
  EXPECT_NE(parse_error({{"CASTMESH_SHM_SPIN_US", "soon"}}).find("CASTMESH_SHM_SPIN_US='soon'"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_SHM_SPIN_US", "-5"}}).find("from 0 to 1000000"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_SHM_SPIN_US", "1000001"}}).find("from 0 to 1000000"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_SHM_SPIN_US", "12us"}}).find("'12us'"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_SHM", "maybe"}}).find("a switch"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_SHM_SPIN_YIELD", "sometimes"}}).find("auto, 1 or 0"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_REDUCTION_ISA", "avx512"}}).find("auto or portable"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_MAX_MESSAGE_BYTES", "0"}}).find("CASTMESH_MAX_MESSAGE_BYTES='0'"),
            std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_HEARTBEAT_INTERVAL_MS", "0"}}).find("from 1"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_RDMA_FALLBACK", "sometimes"}}).find("auto or error"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_RDMA_CHUNK_BYTES", "100"}}).find("from 1024 to 67108864"), std::string::npos);
  EXPECT_NE(parse_error({{"CASTMESH_RDMA_PORT", "256"}}).find("CASTMESH_RDMA_PORT"), std::string::npos);
  // Every malformed one is named, not just the first.
  const std::string both = parse_error({{"CASTMESH_SHM", "2"}, {"CASTMESH_SOCKET_SPIN_US", "x"}});
  EXPECT_NE(both.find("CASTMESH_SHM='2'"), std::string::npos) << both;
  EXPECT_NE(both.find("CASTMESH_SOCKET_SPIN_US='x'"), std::string::npos) << both;
}

TEST(Config, UnknownNamesAreErrorsWithTheNearestKnownName) {
  absl::Status typo = check_names({"PATH=/bin", "CASTMESH_SHM_SPIN_UZ=5", "CASTMESH_SHM=1"});
  EXPECT_EQ(typo.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.message().find("CASTMESH_SHM_SPIN_UZ (did you mean CASTMESH_SHM_SPIN_US?)"), std::string::npos)
      << typo;
  EXPECT_EQ(typo.message().find("PATH"), std::string::npos) << typo;
  absl::Status far = check_names({"CASTMESH_FLUX_CAPACITOR=1"});
  EXPECT_NE(far.message().find("CASTMESH_FLUX_CAPACITOR;"), std::string::npos) << far;
  EXPECT_TRUE(check_names({"CASTMESH_TEST_ANYTHING=1", "castmesh_shm=0", "OTHER_CASTMESH_X=1"}).ok());
}

TEST(Config, TheOtherVariablesOfCastmeshAreKnown) {
  for (const char* name : {proc::kEnvBootstrap, proc::kEnvSecret, proc::kEnvRank, proc::kEnvWorldSize,
                           proc::kEnvTransport, proc::kEnvParentPid, proc::kEnvRendezvous, proc::kEnvAdvertiseHost,
                           proc::kEnvJoinTimeout, proc::kEnvLifelineFd, proc::kEnvSecretFd, proc::kEnvTlsCa,
                           proc::kEnvTlsCert, proc::kEnvTlsKey, proc::kEnvHeartbeatIntervalMs,
                           proc::kEnvHeartbeatTimeoutMs, platform::kEnvHostIdentity, platform::kEnvCpuBind,
                           wire::kEnvMaxMessageBytes, host::kEnvSecretFile, "CASTMESH_LOG", "CASTMESH_BACKEND_PATH",
                           "CASTMESH_REQUIRE_NETNS", "CASTMESH_REQUIRE_SLURM", "CASTMESH_TEST_STAGE"}) {
    EXPECT_TRUE(is_known_variable(name)) << name;
  }
  for (const Setting& setting : settings()) EXPECT_TRUE(is_known_variable(setting.env)) << setting.env;
  EXPECT_FALSE(is_known_variable("shm"));  // a key is not a variable
}

TEST(Config, ConfigureIsAllOrNothingAndLayersOverTheEnvironment) {
  clear_runtime_config();
  ASSERT_TRUE(configure({{"socket_spin_us", "20"}, {"CASTMESH_RDMA_FALLBACK", "error"}}).ok());
  EXPECT_EQ(global().socket_spin, absl::Microseconds(20));
  EXPECT_EQ(global().rdma_fallback, RdmaFallback::kError);
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(runtime_config(), (Pairs{{"socket_spin_us", "20"}, {"rdma_fallback", "error"}}));

  absl::Status bad = configure({{"socket_spin_us", "30"}, {"shm_spin_us", "never"}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'never'"), std::string::npos) << bad;
  absl::Status unknown = configure({{"socket_spin", "30"}});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("'socket_spin' (did you mean socket_spin_us?)"), std::string::npos) << unknown;
  EXPECT_EQ(global().socket_spin, absl::Microseconds(20));  // neither changed anything

  const Config& before = global();
  ASSERT_TRUE(set_runtime_config({{"shm", "0"}}).ok());
  EXPECT_EQ(runtime_config(), (Pairs{{"shm", "0"}}));
  EXPECT_FALSE(global().shm);
  EXPECT_EQ(global().socket_spin, absl::Microseconds(200));
  EXPECT_EQ(before.socket_spin, absl::Microseconds(20));  // an older snapshot stays readable
  clear_runtime_config();
  EXPECT_TRUE(global().shm);
  EXPECT_TRUE(runtime_config().empty());
  EXPECT_EQ(value_text(global(), "no_such").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Config, ProcsStartedAfterConfigureInheritTheRuntimeLayer) {
  clear_runtime_config();
  ASSERT_TRUE(configure({{"shm", "0"}, {"shm_spin_us", "7"}}).ok());
  std::vector<std::string> env = with_runtime_config({"PATH=/bin", "CASTMESH_SHM=1", "CASTMESH_SHM_SPIN_USX=1"});
  clear_runtime_config();
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "CASTMESH_SHM_SPIN_USX=1", "CASTMESH_SHM=0",
                                           "CASTMESH_SHM_SPIN_US=7"}));
  // What such a proc then reads.
  Env child;
  for (const std::string& entry : env) child[entry.substr(0, entry.find('='))] = entry.substr(entry.find('=') + 1);
  absl::StatusOr<Config> config = parse(child);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->shm);
  EXPECT_EQ(config->shm_spin, absl::Microseconds(7));
}

TEST(Config, TheProcessEnvironmentIsCheckedAtStartUp) {
  ASSERT_TRUE(reload_environment().ok()) << "this test needs an environment without stray CASTMESH_ variables";
  ::setenv("CASTMESH_SOCKET_SPIN_US", "55", 1);
  ASSERT_TRUE(reload_environment().ok());
  EXPECT_EQ(global().socket_spin, absl::Microseconds(55));

  ::setenv("CASTMESH_SOCKETS_SPIN_US", "1", 1);
  ::setenv("CASTMESH_SHM_SPIN_US", "lots", 1);
  absl::Status broken = reload_environment();
  EXPECT_EQ(broken.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.message().find("CASTMESH_SOCKETS_SPIN_US"), std::string::npos) << broken;
  EXPECT_NE(broken.message().find("CASTMESH_SHM_SPIN_US='lots'"), std::string::npos) << broken;
  EXPECT_EQ(check_environment(), broken);
  EXPECT_EQ(global().shm_spin, absl::Milliseconds(1));     // the malformed one keeps its default
  EXPECT_EQ(global().socket_spin, absl::Microseconds(55));  // the others apply
  // Starting an endpoint (every runtime's and worker's start) fails with it.
  absl::StatusOr<wire::FrameLimits> limits = wire::apply_environment({});
  EXPECT_EQ(limits.status(), broken);

  ::unsetenv("CASTMESH_SOCKETS_SPIN_US");
  ::unsetenv("CASTMESH_SHM_SPIN_US");
  ::unsetenv("CASTMESH_SOCKET_SPIN_US");
  EXPECT_TRUE(reload_environment().ok());
  EXPECT_TRUE(check_environment().ok());
  EXPECT_TRUE(wire::apply_environment({}).ok());
}

TEST(Config, AWorkerLaunchReadsItsHeartbeatThroughTheTable) {
  Env env = {{"CASTMESH_BOOTSTRAP", "unix:@controller"}, {"CASTMESH_SECRET", "s"}, {"CASTMESH_RANK", "0"},
             {"CASTMESH_WORLD_SIZE", "1"}, {"CASTMESH_HEARTBEAT_INTERVAL_MS", "250"}};
  absl::StatusOr<proc::WorkerLaunch> launch = proc::worker_launch_from(lookup(env));
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->heartbeat_interval, absl::Milliseconds(250));
  EXPECT_EQ(launch->heartbeat_timeout, absl::Seconds(5));
  env["CASTMESH_HEARTBEAT_TIMEOUT_MS"] = "-1";
  launch = proc::worker_launch_from(lookup(env));
  EXPECT_EQ(launch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(launch.status().message().find("CASTMESH_HEARTBEAT_TIMEOUT_MS='-1'"), std::string::npos)
      << launch.status();
}

TEST(Config, DocsListEverySettingWithItsDefault) {
  std::ifstream file(CASTMESH_CONFIG_DOC);
  ASSERT_TRUE(file) << CASTMESH_CONFIG_DOC;
  std::stringstream text;
  text << file.rdbuf();
  for (const Setting& setting : settings()) {
    const std::string row_start = "| `" + std::string(setting.env) + "` | `" + std::string(setting.key) + "` | ";
    const size_t at = text.str().find(row_start);
    ASSERT_NE(at, std::string::npos) << "docs/config.md has no row starting " << row_start;
    const std::string row = text.str().substr(at, text.str().find('\n', at) - at);
    const std::string default_cell =
        setting.default_text.empty() ? "| - |" : "| `" + std::string(setting.default_text) + "` |";
    EXPECT_NE(row.find(default_cell), std::string::npos) << row << " lacks " << default_cell;
  }
}

}  // namespace
}  // namespace castmesh::config
