// The in-process actor workloads of issue 3, shared by the castmesh and the CAF
// implementations so both measure exactly the same programs. Each bench
// executable parses the same command line, runs the workloads one after the
// other on a fresh runtime / actor system each, and prints one line per
// workload. Single-threaded: only a bench executable's main thread calls these.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace castmesh::bench {

// Sizes from issue 3 (before --scale).
inline constexpr int64_t kPingPongRoundTrips = 1'000'000;
inline constexpr int64_t kFanInSenders = 20;
inline constexpr int64_t kFanInMessagesPerSender = 100'000;
inline constexpr int64_t kSpawnActors = 1'000'000;
inline constexpr int64_t kForkJoinWorkers = 64;
inline constexpr int64_t kForkJoinMessagesPerWorker = 15'625;  // 1,000,000 in all
inline constexpr int64_t kAskRoundTrips = 1'000'000;
inline constexpr int64_t kIdleAskSamples = 100;
// Long enough for CAF 0.17's workers to leave their polling phases and sleep.
inline constexpr std::chrono::milliseconds kIdleAskGap{30};

// Savina fork-join's per-message computation: a little floating point work that
// the optimiser cannot drop.
inline void fork_join_work(int64_t message) {
  volatile double sink = std::sin(37.2 + static_cast<double>(message & 7));
  (void)sink;
}

// What a workload produced. `units` are messages, except for spawn (actors)
// and idle ask (round trips); `ns_per_unit` is the figure compared.
struct WorkloadResult {
  std::string name;
  int64_t units = 0;
  double ns_per_unit = 0;
  std::string note;  // extra figures (percentiles, per round trip)
};

struct BenchOptions {
  double scale = 1.0;        // multiplies every count (quick runs on a busy machine)
  std::string only;          // run only the workloads whose names contain this
  bool tsv = false;          // machine-readable lines for run_actor_bench.sh
  int threads = 0;           // worker threads; 0 = the runtime's default
};

// Parses --scale=F --only=NAME --tsv --threads=N; exits with usage on anything else.
BenchOptions parse_bench_options(int argc, char** argv, const char* program);

// Scales a count by options.scale, never below 1.
int64_t scaled(int64_t count, const BenchOptions& options);

bool selected(const std::string& name, const BenchOptions& options);

// Prints one result line (human table or TSV: name, units, ns_per_unit, note).
void print_result(const WorkloadResult& result, const BenchOptions& options);

void print_header(const std::string& implementation, const BenchOptions& options);

// ns per unit over a measured interval.
double ns_per(std::chrono::steady_clock::duration elapsed, int64_t units);

// Median / p90 / max of round-trip samples, for the idle-ask workload.
WorkloadResult summarize_latencies(std::string name, std::vector<double> samples_ns);

// The least a wake-don't-poll runtime can pay for a request/reply between a
// plain thread and an idle worker on this machine: two bare threads, one
// futex wake each way (std::atomic wait/notify off Linux), no queue, no
// allocation. The idle-ask workload samples it between its own samples, so
// both see the same machine: on a VM the wake-up of an idle vCPU moves
// between runs by more than the runtime's own cost. Owned and used by one
// thread (the bench's main thread); the responder thread is internal.
class WakeFloor {
 public:
  WakeFloor();
  ~WakeFloor();
  WakeFloor(const WakeFloor&) = delete;
  WakeFloor& operator=(const WakeFloor&) = delete;

  // One request/reply round trip, in ns.
  double round_trip_ns();

 private:
  std::atomic<uint32_t> request_{0};
  std::atomic<uint32_t> reply_{0};
  std::thread responder_;
};

}  // namespace castmesh::bench
