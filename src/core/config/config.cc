// The one table of settings (castmesh/config.h) and the one place that reads
// them from the environment. docs/config.md is this table in prose; keep the
// two in step (tests/core/config checks that every row is documented there).
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "core/config/settings.h"
#include "core/log/log.h"
#include "core/platform/process.h"

namespace castmesh::config {
namespace {

constexpr std::string_view kPrefix = "CASTMESH_";

// Parses `text` (not empty) into the field of `config` that `info` describes;
// errors name the variable and its unit.
using ParseFn = absl::Status (*)(const Setting& info, std::string_view text, Config& config);
// The field's value as text, in the form the parser takes.
using FormatFn = std::string (*)(const Config& config);

struct Row {
  Setting info;
  ParseFn parse;
  FormatFn format;
};

absl::Status malformed(std::string_view name, std::string_view text, std::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(name), "='", log::printable(text, 40), "' is not ", std::string(expected),
                   " (docs/config.md)"));
}

absl::StatusOr<bool> parse_switch(std::string_view name, std::string_view text) {
  const std::string lower = absl::AsciiStrToLower(std::string(text));
  for (std::string_view on : {"1", "true", "on", "yes"}) {
    if (lower == on) return true;
  }
  for (std::string_view off : {"0", "false", "off", "no"}) {
    if (lower == off) return false;
  }
  return malformed(name, text, "a switch (1/0, true/false, on/off, yes/no)");
}

absl::StatusOr<uint64_t> parse_whole(const Setting& info, std::string_view text, uint64_t min, uint64_t max) {
  const std::string_view name = info.env;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return malformed(name, text, absl::StrCat("a whole number (", std::string(info.unit), ") from ", min, " to ", max));
  }
  return value;
}

// The parse function of a switch field, and its format.
template <bool Config::*Field>
absl::Status parse_bool_field(const Setting& info, std::string_view text, Config& config) {
  absl::StatusOr<bool> on = parse_switch(info.env, text);
  if (!on.ok()) return on.status();
  config.*Field = *on;
  return absl::OkStatus();
}
template <bool Config::*Field>
std::string format_bool_field(const Config& config) {
  return config.*Field ? "1" : "0";
}

// A whole number in [Min, Max] stored as an integer field.
template <typename T, T Config::*Field, uint64_t Min, uint64_t Max>
absl::Status parse_int_field(const Setting& info, std::string_view text, Config& config) {
  absl::StatusOr<uint64_t> value = parse_whole(info, text, Min, Max);
  if (!value.ok()) return value.status();
  config.*Field = static_cast<T>(*value);
  return absl::OkStatus();
}
template <typename T, T Config::*Field>
std::string format_int_field(const Config& config) {
  return absl::StrCat(config.*Field);
}

// A whole number of microseconds (Ms: milliseconds) in [Min, Max] stored as a Duration.
template <absl::Duration Config::*Field, uint64_t Min, uint64_t Max, bool Ms>
absl::Status parse_duration_field(const Setting& info, std::string_view text, Config& config) {
  absl::StatusOr<uint64_t> value = parse_whole(info, text, Min, Max);
  if (!value.ok()) return value.status();
  const auto count = static_cast<int64_t>(*value);
  config.*Field = Ms ? absl::Milliseconds(count) : absl::Microseconds(count);
  return absl::OkStatus();
}
template <absl::Duration Config::*Field, bool Ms>
std::string format_duration_field(const Config& config) {
  return absl::StrCat(Ms ? absl::ToInt64Milliseconds(config.*Field) : absl::ToInt64Microseconds(config.*Field));
}

// The names of a two-way choice, in the order of its enum's values.
constexpr std::string_view kIsaNames[] = {"auto", "portable"};   // ReductionIsa
constexpr std::string_view kFallbackNames[] = {"auto", "error"};  // RdmaFallback

template <typename E, E Config::*Field, const std::string_view (&Names)[2]>
absl::Status parse_choice_field(const Setting& info, std::string_view text, Config& config) {
  const std::string lower = absl::AsciiStrToLower(std::string(text));
  for (size_t i = 0; i < 2; ++i) {
    if (lower == Names[i]) {
      config.*Field = static_cast<E>(i);
      return absl::OkStatus();
    }
  }
  return malformed(info.env, text, absl::StrCat(std::string(Names[0]), " or ", std::string(Names[1])));
}
template <typename E, E Config::*Field, const std::string_view (&Names)[2]>
std::string format_choice_field(const Config& config) {
  return std::string(Names[static_cast<size_t>(config.*Field)]);
}

constexpr uint64_t kMaxSpinUs = 1'000'000;
constexpr uint64_t kMaxSocketSpinUs = 100'000;
constexpr uint64_t kMaxMs = std::numeric_limits<int32_t>::max();
constexpr uint64_t kMinRdmaChunk = 1024;              // as the RDMA service clamps a peer's chunk
constexpr uint64_t kMaxRdmaChunk = uint64_t{64} << 20;

// The table; its length follows from the rows (std::to_array).
const auto kRows = std::to_array<Row>({
    // --- collectives ---
    {{"shm", "CASTMESH_SHM", SettingKind::kBool, "1", "0/1",
      "shared-memory rings between procs of one host; 0: every message goes through the socket transport", true},
     &parse_bool_field<&Config::shm>, &format_bool_field<&Config::shm>},
    {{"shm_spin_us", "CASTMESH_SHM_SPIN_US", SettingKind::kInteger, "1000", "us",
      "how long a waiter on a shared-memory ring spins before it sleeps", true},
     &parse_duration_field<&Config::shm_spin, 0, kMaxSpinUs, false>,
     &format_duration_field<&Config::shm_spin, false>},
    {{"shm_spin_oversubscribed_us", "CASTMESH_SHM_SPIN_OVERSUBSCRIBED_US", SettingKind::kInteger, "", "us",
      "the same spin while the host's procs outnumber its cores (unset: shm_spin_us)", true},
     [](const Setting& info, std::string_view text, Config& config) -> absl::Status {
       absl::StatusOr<uint64_t> us = parse_whole(info, text, 0, kMaxSpinUs);
       if (!us.ok()) return us.status();
       config.shm_spin_oversubscribed = absl::Microseconds(static_cast<int64_t>(*us));
       return absl::OkStatus();
     },
     [](const Config& config) -> std::string {
       return config.shm_spin_oversubscribed ? absl::StrCat(absl::ToInt64Microseconds(*config.shm_spin_oversubscribed))
                                             : "";
     }},
    {{"shm_spin_yield", "CASTMESH_SHM_SPIN_YIELD", SettingKind::kChoice, "auto", "auto|0|1",
      "whether that spin yields the core at every look (1), pauses (0), or yields only while its core is contended "
      "(auto)",
      true},
     [](const Setting& info, std::string_view text, Config& config) -> absl::Status {
       const std::string_view name = info.env;
       if (absl::AsciiStrToLower(std::string(text)) == "auto") {
         config.shm_spin_yield = SpinYield::kAuto;
         return absl::OkStatus();
       }
       absl::StatusOr<bool> yield = parse_switch(name, text);
       if (!yield.ok()) return malformed(name, text, "auto, 1 or 0");
       config.shm_spin_yield = *yield ? SpinYield::kYield : SpinYield::kPause;
       return absl::OkStatus();
     },
     [](const Config& config) -> std::string {
       switch (config.shm_spin_yield) {
         case SpinYield::kPause: return "0";
         case SpinYield::kYield: return "1";
         case SpinYield::kAuto: break;
       }
       return "auto";
     }},
    {{"shm_waiter_sleep", "CASTMESH_SHM_WAITER_SLEEP", SettingKind::kBool, "1", "0/1",
      "a waiter sleeps on its ring's bell after the spin; 0: drain threads serve it (for measurements)", true},
     &parse_bool_field<&Config::shm_waiter_sleep>, &format_bool_field<&Config::shm_waiter_sleep>},
    {{"single_copy", "CASTMESH_SINGLE_COPY", SettingKind::kBool, "1", "0/1",
      "messages of 64 KiB and more between procs of one host are copied once, process to process "
      "(process_vm_readv); 0: they stream through the ring",
      true},
     &parse_bool_field<&Config::single_copy>, &format_bool_field<&Config::single_copy>},
    {{"socket_wait", "CASTMESH_SOCKET_WAIT", SettingKind::kBool, "1", "0/1",
      "a thread waiting for a message reads its socket itself; 0: the I/O thread reads everything", true},
     &parse_bool_field<&Config::socket_wait>, &format_bool_field<&Config::socket_wait>},
    {{"socket_io_defer", "CASTMESH_SOCKET_IO_DEFER", SettingKind::kBool, "1", "0/1",
      "the I/O thread gives way to such a reader on wake-up (SCHED_BATCH); 0: it preempts", true},
     &parse_bool_field<&Config::socket_io_defer>, &format_bool_field<&Config::socket_io_defer>},
    {{"socket_spin_us", "CASTMESH_SOCKET_SPIN_US", SettingKind::kInteger, "200", "us",
      "how long such a reader spins on its socket before it sleeps", true},
     &parse_duration_field<&Config::socket_spin, 0, kMaxSocketSpinUs, false>,
     &format_duration_field<&Config::socket_spin, false>},
    {{"reduction_isa", "CASTMESH_REDUCTION_ISA", SettingKind::kChoice, "auto", "auto|portable",
      "the reduction kernels: the best this CPU runs (AVX2 where built and present), or the portable ones", true},
     &parse_choice_field<ReductionIsa, &Config::reduction_isa, kIsaNames>,
     &format_choice_field<ReductionIsa, &Config::reduction_isa, kIsaNames>},
    // --- progress ---
    {{"progress_max_workers", "CASTMESH_PROGRESS_MAX_WORKERS", SettingKind::kInteger, "64", "threads",
      "the progress engine's workers at most (non-blocking collectives, large RDMA copies); more jobs queue", true},
     &parse_int_field<int, &Config::progress_max_workers, 1, 4096>,
     &format_int_field<int, &Config::progress_max_workers>},
    // --- transport ---
    {{"max_message_bytes", "CASTMESH_MAX_MESSAGE_BYTES", SettingKind::kInteger, "1073741824", "bytes",
      "the largest payload of one frame a connection accepts (an endpoint's own limit, when set, wins)", false},
     &parse_int_field<uint64_t, &Config::max_message_bytes, 1, std::numeric_limits<uint64_t>::max()>,
     &format_int_field<uint64_t, &Config::max_message_bytes>},
    {{"heartbeat_interval_ms", "CASTMESH_HEARTBEAT_INTERVAL_MS", SettingKind::kInteger, "500", "ms",
      "a worker proc's connections: how often an idle one sends a heartbeat (a HostMesh's agents set it)", true},
     &parse_duration_field<&Config::heartbeat_interval, 1, kMaxMs, true>,
     &format_duration_field<&Config::heartbeat_interval, true>},
    {{"heartbeat_timeout_ms", "CASTMESH_HEARTBEAT_TIMEOUT_MS", SettingKind::kInteger, "5000", "ms",
      "a worker proc's connections: after how long without a frame the peer is lost (a HostMesh's agents set it)",
      true},
     &parse_duration_field<&Config::heartbeat_timeout, 1, kMaxMs, true>,
     &format_duration_field<&Config::heartbeat_timeout, true>},
    // --- RDMA ---
    {{"rdma_fallback", "CASTMESH_RDMA_FALLBACK", SettingKind::kChoice, "auto", "auto|error",
      "error: an RDMA operation ibverbs cannot carry fails (FailedPrecondition) instead of using single copy, a "
      "shared segment or the socket",
      false},
     &parse_choice_field<RdmaFallback, &Config::rdma_fallback, kFallbackNames>,
     &format_choice_field<RdmaFallback, &Config::rdma_fallback, kFallbackNames>},
    {{"rdma_single_copy", "CASTMESH_RDMA_SINGLE_COPY", SettingKind::kBool, "1", "0/1",
      "same-host RDMA operations copy process to process; 0: a shared segment (or the socket) instead", false},
     &parse_bool_field<&Config::rdma_single_copy>, &format_bool_field<&Config::rdma_single_copy>},
    {{"rdma_one_sided", "CASTMESH_RDMA_ONE_SIDED", SettingKind::kBool, "1", "0/1",
      "those copies need no message to the owner (its registration table); 0: a lease per operation", false},
     &parse_bool_field<&Config::rdma_one_sided>, &format_bool_field<&Config::rdma_one_sided>},
    {{"rdma_shared_segment", "CASTMESH_RDMA_SHARED_SEGMENT", SettingKind::kBool, "1", "0/1",
      "same-host RDMA operations may go through a shared-memory window; 0: the socket instead", false},
     &parse_bool_field<&Config::rdma_shared_segment>, &format_bool_field<&Config::rdma_shared_segment>},
    {{"rdma_chunk_bytes", "CASTMESH_RDMA_CHUNK_BYTES", SettingKind::kInteger, "1048576", "bytes",
      "the chunk RDMA operations over the socket or a shared segment move at a time", false},
     &parse_int_field<uint64_t, &Config::rdma_chunk_bytes, kMinRdmaChunk, kMaxRdmaChunk>,
     &format_int_field<uint64_t, &Config::rdma_chunk_bytes>},
    {{"rdma_device", "CASTMESH_RDMA_DEVICE", SettingKind::kText, "", "name",
      "the RDMA NIC the rdma backend opens (e.g. mlx5_0; empty: the first one)", true},
     [](const Setting&, std::string_view text, Config& config) -> absl::Status {
       config.rdma_device = std::string(text);
       return absl::OkStatus();
     },
     [](const Config& config) -> std::string { return config.rdma_device; }},
    {{"rdma_port", "CASTMESH_RDMA_PORT", SettingKind::kInteger, "0", "port",
      "that NIC's port (0: the backend's default, 1)", true},
     &parse_int_field<uint32_t, &Config::rdma_port, 0, 255>, &format_int_field<uint32_t, &Config::rdma_port>},
    {{"rdma_gid_index", "CASTMESH_RDMA_GID_INDEX", SettingKind::kInteger, "0", "index",
      "that port's GID table entry (RoCE v2 often needs another; see show_gids)", true},
     &parse_int_field<uint32_t, &Config::rdma_gid_index, 0, 65535>,
     &format_int_field<uint32_t, &Config::rdma_gid_index>},
    {{"trace", "CASTMESH_TRACE", SettingKind::kText, "", "path",
      "record a trace of message flow; the controller writes it to this file at trace stop or exit "
      "(empty: no trace; docs/observability.md)",
      true},
     [](const Setting&, std::string_view text, Config& config) -> absl::Status {
       config.trace = std::string(text);
       return absl::OkStatus();
     },
     [](const Config& config) -> std::string { return config.trace; }},
    {{"trace_buffer_records", "CASTMESH_TRACE_BUFFER_RECORDS", SettingKind::kInteger, "16384", "records",
      "trace records kept per thread (48 bytes each); older ones are dropped and counted", false},
     &parse_int_field<uint64_t, &Config::trace_buffer_records, 64, uint64_t{1} << 26>,
     &format_int_field<uint64_t, &Config::trace_buffer_records>},
});
constexpr size_t kRowCount = std::tuple_size_v<decltype(kRows)>;

// CASTMESH_ variables that are not settings: each is owned (read, and
// documented) where its comment says. The name check accepts them, and
// names that start with one of kOtherPrefixes.
constexpr std::string_view kOtherVariables[] = {
    // A worker's launch and rendezvous (src/core/proc/launch_env.h, proc_host.h, docs/procs.md).
    "CASTMESH_BOOTSTRAP", "CASTMESH_RENDEZVOUS", "CASTMESH_SECRET", "CASTMESH_SECRET_FD", "CASTMESH_SECRET_FILE",
    "CASTMESH_RANK", "CASTMESH_WORLD_SIZE", "CASTMESH_TRANSPORT", "CASTMESH_PARENT_PID", "CASTMESH_LIFELINE_FD",
    "CASTMESH_JOIN_TIMEOUT", "CASTMESH_ADVERTISE_HOST", "CASTMESH_CPU_BIND", "CASTMESH_HOST_IDENTITY",
    "CASTMESH_TLS_CA", "CASTMESH_TLS_CERT", "CASTMESH_TLS_KEY",
    // The program: log level (src/core/log), backend folders (src/core/plugin), Python workers and jobs
    // (src/cli/castmesh_host.cc, python/castmesh).
    "CASTMESH_LOG", "CASTMESH_BACKEND_PATH", "CASTMESH_PYTHON", "CASTMESH_PY_PATH", "CASTMESH_PY_WORKER",
    "CASTMESH_JOB_PORT", "CASTMESH_JOB_PYTHON",
    // Scripts, CI, tests and benchmarks (scripts/, tests/, bench/): they are in the environment of the
    // processes those start.
    "CASTMESH_JOBS", "CASTMESH_SKIP", "CASTMESH_ONLY", "CASTMESH_EXAMPLE_TARGET",
    "CASTMESH_CROSS_BUILD_DIR", "CASTMESH_FUZZ_BUILD", "CASTMESH_FUZZ_SECONDS", "CASTMESH_GPU_CHECK_BUILD",
    "CASTMESH_SLURM_DIR", "CASTMESH_SLURM_KEEP_DIR", "CASTMESH_SLURM_PREFIX", "CASTMESH_NETNS_BRNF_OFF",
    "CASTMESH_NETNS_STATE_DIR", "CASTMESH_REQUIRE_NETNS", "CASTMESH_REQUIRE_SLURM", "CASTMESH_MPI4PY_CACHE",
    "CASTMESH_BENCH_TLS_DIR", "CASTMESH_FAKE_NIC_DELAY_MS", "CASTMESH_FAKE_TE_NCCL"};
constexpr std::string_view kOtherPrefixes[] = {"CASTMESH_TEST_"};

const Row* row_named(std::string_view name) {
  for (const Row& row : kRows) {
    if (row.info.key == name || row.info.env == name) return &row;
  }
  return nullptr;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// " (did you mean X?)" for the nearest known name within 3 edits, else "".
std::string suggestion(std::string_view name, bool keys) {
  std::string_view best;
  size_t best_distance = 4;
  auto consider = [&](std::string_view candidate) {
    // A name cut short ("socket_spin" for "socket_spin_us") is nearer than one as many edits away.
    const size_t d = candidate.starts_with(name) ? 1 : edit_distance(name, candidate);
    if (d < best_distance) best = candidate, best_distance = d;
  };
  for (const Row& row : kRows) consider(keys ? row.info.key : row.info.env);
  if (!keys) {
    for (std::string_view other : kOtherVariables) consider(other);
  }
  return best.empty() ? "" : absl::StrCat(" (did you mean ", std::string(best), "?)");
}

// Applies (row, text) pairs to `config`; the errors, joined.
absl::Status apply_values(const std::vector<std::pair<const Row*, std::string>>& values, Config& config) {
  std::vector<std::string> errors;
  for (const auto& [row, text] : values) {
    if (absl::Status st = row->parse(row->info, text, config); !st.ok()) errors.emplace_back(st.message());
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

// The process-wide layers and the published snapshots.
class State {
 public:
  static State& instance() {
    static auto* state = new State;  // never destroyed: global() references outlive static destruction
    return *state;
  }

  const Config& current() {
    const Config* config = current_.load(std::memory_order_acquire);
    if (config != nullptr) return *config;
    detail::MutexLock lock(mu_);
    if (!loaded_) load_locked();
    return *current_.load(std::memory_order_acquire);
  }

  absl::Status check() {
    if (loaded_ok_.load(std::memory_order_acquire)) return absl::OkStatus();
    detail::MutexLock lock(mu_);
    if (!loaded_) load_locked();
    return env_error_;
  }

  absl::Status reload() {
    detail::MutexLock lock(mu_);
    load_locked();
    return env_error_;
  }

  absl::Status set_runtime(const std::vector<std::pair<std::string, std::string>>& values, bool replace) {
    std::vector<std::pair<const Row*, std::string>> parsed;
    std::vector<std::string> unknown;
    for (const auto& [name, text] : values) {
      const Row* row = row_named(name);
      if (row == nullptr) {
        unknown.push_back(absl::StrCat("'", log::printable(name, 60), "'", suggestion(name, true)));
      } else {
        parsed.emplace_back(row, text);
      }
    }
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown setting ", absl::StrJoin(unknown, ", "),
                                                     "; the settings are listed in docs/config.md"));
    }
    Config probe;
    if (absl::Status st = apply_values(parsed, probe); !st.ok()) return st;
    for (auto& [row, text] : parsed) text = row->format(probe);  // "true" is kept (and inherited) as "1"
    detail::MutexLock lock(mu_);
    if (!loaded_) load_locked();
    if (replace) runtime_.fill(std::nullopt);
    for (const auto& [row, text] : parsed) runtime_[static_cast<size_t>(row - kRows.data())] = text;
    publish_locked();
    return absl::OkStatus();
  }

  std::vector<std::pair<std::string, std::string>> runtime() {
    detail::MutexLock lock(mu_);
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 0; i < kRows.size(); ++i) {
      if (runtime_[i]) out.emplace_back(kRows[i].info.key, *runtime_[i]);
    }
    return out;
  }

  std::vector<std::string> child_environment(std::vector<std::string> env) {
    detail::MutexLock lock(mu_);
    for (size_t i = 0; i < kRows.size(); ++i) {
      if (!runtime_[i]) continue;
      const std::string prefix = std::string(kRows[i].info.env) + "=";
      std::erase_if(env, [&](const std::string& entry) { return entry.starts_with(prefix); });
      env.push_back(absl::StrCat(prefix, *runtime_[i]));
    }
    return env;
  }

 private:
  State() = default;

  void load_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string_view> entries;
    for (char** e = platform::environment(); e != nullptr && *e != nullptr; ++e) entries.emplace_back(*e);
    std::vector<std::string> errors;
    if (absl::Status names = check_names(entries); !names.ok()) errors.emplace_back(names.message());
    env_.fill(std::nullopt);
    for (std::string_view entry : entries) {
      const size_t eq = entry.find('=');
      if (eq == std::string_view::npos || eq + 1 == entry.size()) continue;  // empty: unset
      const Row* row = row_named(entry.substr(0, eq));
      if (row == nullptr || !entry.starts_with(kPrefix)) continue;
      if (env_[static_cast<size_t>(row - kRows.data())]) continue;  // the first entry of a name counts, as for getenv
      const std::string text(entry.substr(eq + 1));
      Config probe;
      if (absl::Status st = row->parse(row->info, text, probe); !st.ok()) {
        errors.emplace_back(st.message());
        continue;  // the setting keeps its default; check() reports it
      }
      env_[static_cast<size_t>(row - kRows.data())] = text;
    }
    env_error_ = errors.empty() ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
    if (!env_error_.ok()) CASTMESH_LOG_ERROR("castmesh settings: {}", std::string(env_error_.message()));
    loaded_ = true;
    loaded_ok_.store(env_error_.ok(), std::memory_order_release);
    publish_locked();
  }

  void publish_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto config = std::make_unique<Config>();
    for (size_t i = 0; i < kRows.size(); ++i) {
      const std::optional<std::string>& text = runtime_[i] ? runtime_[i] : env_[i];
      if (text) (void)kRows[i].parse(kRows[i].info, *text, *config);  // validated when stored
    }
    current_.store(config.get(), std::memory_order_release);
    snapshots_.push_back(std::move(config));  // references handed out stay valid
  }

  detail::Mutex mu_;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::optional<std::string>, kRowCount> env_ ABSL_GUARDED_BY(mu_);
  std::array<std::optional<std::string>, kRowCount> runtime_ ABSL_GUARDED_BY(mu_);
  absl::Status env_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<const Config>> snapshots_ ABSL_GUARDED_BY(mu_);
  std::atomic<const Config*> current_{nullptr};
  std::atomic<bool> loaded_ok_{false};
};

}  // namespace

std::span<const Setting> settings() {
  static const auto* table = [] {
    auto* rows = new std::vector<Setting>;
    for (const Row& row : kRows) rows->push_back(row.info);
    return rows;
  }();
  return *table;
}

const Config& global() { return State::instance().current(); }

absl::Status check_environment() { return State::instance().check(); }

absl::Status reload_environment() { return State::instance().reload(); }

absl::Status configure(const std::vector<std::pair<std::string, std::string>>& values) {
  return State::instance().set_runtime(values, false);
}

std::vector<std::pair<std::string, std::string>> runtime_config() { return State::instance().runtime(); }

absl::Status set_runtime_config(const std::vector<std::pair<std::string, std::string>>& values) {
  return State::instance().set_runtime(values, true);
}

void clear_runtime_config() { (void)State::instance().set_runtime({}, true); }

absl::StatusOr<std::string> value_text(const Config& config, std::string_view key) {
  const Row* row = row_named(key);
  if (row == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown setting '", log::printable(key, 60), "'",
                                                   suggestion(key, true), "; see docs/config.md"));
  }
  return row->format(config);
}

absl::StatusOr<Config> parse_environment(const EnvLookup& env) {
  std::vector<std::pair<const Row*, std::string>> values;
  for (const Row& row : kRows) {
    const std::string name(row.info.env);
    const char* text = env(name.c_str());
    if (text != nullptr && *text != '\0') values.emplace_back(&row, text);
  }
  Config config;
  if (absl::Status st = apply_values(values, config); !st.ok()) return st;
  return config;
}

bool is_known_variable(std::string_view name) {
  if (row_named(name) != nullptr && name.starts_with(kPrefix)) return true;
  if (std::find(std::begin(kOtherVariables), std::end(kOtherVariables), name) != std::end(kOtherVariables)) {
    return true;
  }
  return std::any_of(std::begin(kOtherPrefixes), std::end(kOtherPrefixes),
                     [&](std::string_view prefix) { return name.starts_with(prefix); });
}

absl::Status check_names(const std::vector<std::string_view>& environment) {
  std::vector<std::string> unknown;
  for (std::string_view entry : environment) {
    const std::string_view name = entry.substr(0, entry.find('='));
    if (!name.starts_with(kPrefix) || is_known_variable(name)) continue;
    unknown.push_back(absl::StrCat(log::printable(name, 60), suggestion(name, false)));
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown castmesh setting", unknown.size() > 1 ? "s" : "", " in the environment: ", absl::StrJoin(unknown, ", "),
      "; the settings and castmesh's other CASTMESH_ variables are listed in docs/config.md"));
}

std::vector<std::string> with_runtime_config(std::vector<std::string> env) {
  return State::instance().child_environment(std::move(env));
}

}  // namespace castmesh::config
