#include "actor_workloads.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace castmesh::bench {

BenchOptions parse_bench_options(int argc, char** argv, const char* program) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strncmp(arg, "--scale=", 8) == 0) {
      options.scale = std::atof(arg + 8);
    } else if (std::strncmp(arg, "--only=", 7) == 0) {
      options.only = arg + 7;
    } else if (std::strcmp(arg, "--tsv") == 0) {
      options.tsv = true;
    } else if (std::strncmp(arg, "--threads=", 10) == 0) {
      options.threads = std::atoi(arg + 10);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--scale=F] [--only=NAME] [--threads=N] [--tsv]\n"
                   "  --scale=F    multiply every message/actor count by F (default 1)\n"
                   "  --only=NAME  run only workloads whose name contains NAME\n"
                   "  --threads=N  worker threads (default: hardware concurrency)\n"
                   "  --tsv        print name<TAB>units<TAB>ns_per_unit<TAB>note lines\n",
                   program);
      std::exit(2);
    }
  }
  if (!(options.scale > 0)) {
    std::fprintf(stderr, "%s: --scale must be > 0\n", program);
    std::exit(2);
  }
  return options;
}

int64_t scaled(int64_t count, const BenchOptions& options) {
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(count) * options.scale));
}

bool selected(const std::string& name, const BenchOptions& options) {
  return options.only.empty() || name.find(options.only) != std::string::npos;
}

void print_header(const std::string& implementation, const BenchOptions& options) {
  if (options.tsv) return;
  std::printf("%s actor benchmarks (scale %g)\n", implementation.c_str(), options.scale);
  std::printf("%-16s %12s %12s %12s  %s\n", "workload", "units", "ns/unit", "Munits/s", "note");
}

void print_result(const WorkloadResult& result, const BenchOptions& options) {
  if (options.tsv) {
    std::printf("%s\t%lld\t%.1f\t%s\n", result.name.c_str(), static_cast<long long>(result.units),
                result.ns_per_unit, result.note.c_str());
  } else {
    std::printf("%-16s %12lld %12.1f %12.3f  %s\n", result.name.c_str(),
                static_cast<long long>(result.units), result.ns_per_unit,
                1e3 / result.ns_per_unit, result.note.c_str());
  }
  std::fflush(stdout);
}

double ns_per(std::chrono::steady_clock::duration elapsed, int64_t units) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
         static_cast<double>(units);
}

WorkloadResult summarize_latencies(std::string name, std::vector<double> samples_ns) {
  std::sort(samples_ns.begin(), samples_ns.end());
  auto at = [&](double q) {
    return samples_ns[std::min(samples_ns.size() - 1, static_cast<size_t>(q * samples_ns.size()))];
  };
  char note[128];
  std::snprintf(note, sizeof note, "median; min=%.1fus p90=%.1fus max=%.1fus", samples_ns.front() / 1e3,
                at(0.9) / 1e3, samples_ns.back() / 1e3);
  return WorkloadResult{std::move(name), static_cast<int64_t>(samples_ns.size()), at(0.5), note};
}

namespace {
constexpr uint32_t kStopResponder = UINT32_MAX;

void wait_while_equal(std::atomic<uint32_t>& word, uint32_t value) {
  while (word.load(std::memory_order_acquire) == value) {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
#else
    word.wait(value, std::memory_order_acquire);
#endif
  }
}

void wake_one(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#else
  word.notify_one();
#endif
}
}  // namespace

WakeFloor::WakeFloor()
    : responder_([this] {
        uint32_t seen = 0;
        for (;;) {
          wait_while_equal(request_, seen);
          seen = request_.load(std::memory_order_acquire);
          if (seen == kStopResponder) return;
          reply_.store(seen, std::memory_order_release);
          wake_one(reply_);
        }
      }) {}

WakeFloor::~WakeFloor() {
  request_.store(kStopResponder, std::memory_order_release);
  wake_one(request_);
  responder_.join();
}

double WakeFloor::round_trip_ns() {
  const uint32_t before = reply_.load(std::memory_order_acquire);
  const auto start = std::chrono::steady_clock::now();
  request_.store(before + 1, std::memory_order_release);
  wake_one(request_);
  wait_while_equal(reply_, before);
  return ns_per(std::chrono::steady_clock::now() - start, 1);
}

}  // namespace castmesh::bench
