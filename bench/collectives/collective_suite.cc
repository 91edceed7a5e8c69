// The shared measurements of the collectives benchmark; see collective_suite.h.
#include "collective_suite.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>

namespace castmesh_bench {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSizes[] = {8,          64,         256,        1 << 10,    4 << 10,     16 << 10,
                             64 << 10,   256 << 10,  1 * kMiB,   4 * kMiB,   16 * kMiB,   64 * kMiB};
constexpr std::string_view kOps[] = {"allreduce", "broadcast", "allgather", "barrier", "pingpong", "memcpy"};

// How many calls one figure takes: warm-up calls, then `samples` timed
// batches of `calls` each. Small sizes batch many calls so that a sample is
// long against the clock and the barrier's skew; large ones take fewer
// samples so that a run stays within minutes.
struct Policy {
  int warmup_calls;
  int samples;
  int calls;
};

Policy policy_for(size_t bytes, bool quick) {
  int calls = static_cast<int>(std::clamp<size_t>(kMiB / std::max<size_t>(bytes, 1), 1, 100));
  int samples = bytes <= kMiB ? 15 : bytes <= 16 * kMiB ? 9 : 5;
  if (quick) {
    calls = std::min(calls, 5);
    samples = 3;
  }
  return Policy{std::max(calls, 2), samples, calls};
}

// A page-aligned buffer, every page written once so that no page fault
// lands in a timed call.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : bytes_(bytes), data_(static_cast<unsigned char*>(std::aligned_alloc(4096, round_up(bytes)))) {
    if (data_ == nullptr) {
      std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
      std::exit(3);
    }
    std::memset(data_, 0, round_up(bytes));
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  unsigned char* bytes() { return data_; }
  float* floats() { return reinterpret_cast<float*>(data_); }
  size_t size() const { return bytes_; }

 private:
  static size_t round_up(size_t bytes) { return (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096; }
  size_t bytes_;
  unsigned char* data_;
};

// Keeps the compiler from dropping or merging memcpy calls whose result
// nobody reads.
inline void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One figure: the op, its size in bytes (0 for the barrier), the median
// time per call in microseconds and the bus bandwidth in GB/s (0: none).
struct Row {
  std::string op;
  size_t bytes;
  double us;
  double busbw_gbps;
};

std::string size_label(size_t bytes) {
  if (bytes == 0) return "-";
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " B";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

class Suite {
 public:
  Suite(CollectiveLibrary& lib, const SuiteOptions& options) : lib_(lib), options_(options) {}

  int run() {
    const int n = lib_.size();
    if (lib_.rank() == 0) print_header();
    for (std::string_view op : kOps) {
      if (!selected(op)) continue;
      if (op == "barrier") {
        barrier_row();
        continue;
      }
      if (op == "pingpong" && n < 2) {
        note("pingpong skipped: it needs at least 2 ranks");
        continue;
      }
      for (size_t bytes : kSizes) {
        if (bytes > options_.max_bytes) break;
        if (op == "allreduce") allreduce_row(bytes);
        if (op == "broadcast") broadcast_row(bytes);
        if (op == "allgather") allgather_row(bytes);
        if (op == "pingpong") pingpong_row(bytes);
        if (op == "memcpy") memcpy_row(bytes);
      }
    }
    if (lib_.rank() == 0) print_rows();
    return 0;
  }

 private:
  bool selected(std::string_view op) const {
    return options_.ops.empty() || std::find(options_.ops.begin(), options_.ops.end(), op) != options_.ops.end();
  }

  void note(const std::string& text) {
    if (lib_.rank() == 0) notes_.push_back(text);
  }

  // This rank's samples of `call` (microseconds per call), every sample
  // starting after a barrier of all ranks.
  std::vector<double> time_collective(const Policy& p, const std::function<void()>& call) {
    for (int i = 0; i < p.warmup_calls; ++i) call();
    std::vector<double> samples;
    for (int s = 0; s < p.samples; ++s) {
      lib_.barrier();
      const double start = now_us();
      for (int c = 0; c < p.calls; ++c) call();
      samples.push_back((now_us() - start) / p.calls);
    }
    return samples;
  }

  // The figure of a measurement every rank took part in: per sample the
  // slowest rank, then the median over samples. Rank 0 only.
  double slowest_rank_median(const std::vector<double>& mine) {
    const std::vector<double> all = lib_.gather_to_root(mine);
    if (lib_.rank() != 0) return 0;
    std::vector<double> slowest(mine.size(), 0);
    for (size_t i = 0; i < all.size(); ++i) slowest[i % mine.size()] = std::max(slowest[i % mine.size()], all[i]);
    return median(slowest);
  }

  void add_row(const std::string& op, size_t bytes, double us, double busbw_factor) {
    if (lib_.rank() != 0) return;
    const double algbw_gbps = us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0;
    rows_.push_back(Row{op, bytes, us, algbw_gbps * busbw_factor});
  }

  void fail(const std::string& op, size_t bytes, const std::string& what) {
    lib_.abort_job(lib_.name() + " " + op + " " + size_label(bytes) + ": " + what);
  }

  void allreduce_row(size_t bytes) {
    const size_t count = bytes / sizeof(float);
    const int n = lib_.size();
    Buffer in(bytes), out(bytes);
    std::fill(in.floats(), in.floats() + count, static_cast<float>(lib_.rank() + 1));
    const double us = slowest_rank_median(time_collective(
        policy_for(bytes, options_.quick), [&] { lib_.allreduce_sum(in.floats(), out.floats(), count); }));
    std::fill(out.floats(), out.floats() + count, 0.0f);
    lib_.allreduce_sum(in.floats(), out.floats(), count);
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      if (out.floats()[i] != want) {
        fail("allreduce", bytes, "element " + std::to_string(i) + " is " + std::to_string(out.floats()[i]) +
                                     ", want " + std::to_string(want));
      }
    }
    add_row("allreduce", bytes, us, 2.0 * (n - 1) / n);
  }

  static unsigned char pattern(size_t i, int salt) { return static_cast<unsigned char>((i * 131 + salt * 29 + 7) & 0xff); }

  void broadcast_row(size_t bytes) {
    Buffer data(bytes);
    const double us = slowest_rank_median(
        time_collective(policy_for(bytes, options_.quick), [&] { lib_.broadcast(data.bytes(), bytes, 0); }));
    for (size_t i = 0; i < bytes; ++i) data.bytes()[i] = lib_.rank() == 0 ? pattern(i, 1) : 0;
    lib_.broadcast(data.bytes(), bytes, 0);
    for (size_t i = 0; i < bytes; ++i) {
      if (data.bytes()[i] != pattern(i, 1)) fail("broadcast", bytes, "byte " + std::to_string(i) + " differs from root's");
    }
    add_row("broadcast", bytes, us, 1.0);
  }

  void allgather_row(size_t bytes) {
    const int n = lib_.size();
    const size_t per_rank = bytes / static_cast<size_t>(n);
    if (per_rank == 0) return;
    const size_t total = per_rank * static_cast<size_t>(n);
    Buffer in(per_rank), out(total);
    for (size_t i = 0; i < per_rank; ++i) in.bytes()[i] = pattern(i, lib_.rank());
    const double us = slowest_rank_median(
        time_collective(policy_for(total, options_.quick), [&] { lib_.allgather(in.bytes(), out.bytes(), per_rank); }));
    std::memset(out.bytes(), 0, total);
    lib_.allgather(in.bytes(), out.bytes(), per_rank);
    for (size_t i = 0; i < total; ++i) {
      if (out.bytes()[i] != pattern(i % per_rank, static_cast<int>(i / per_rank))) {
        fail("allgather", total, "byte " + std::to_string(i) + " is not rank " + std::to_string(i / per_rank) + "'s");
      }
    }
    add_row("allgather", total, us, static_cast<double>(n - 1) / n);
  }

  void barrier_row() {
    Policy p = policy_for(0, options_.quick);
    const double us = slowest_rank_median(time_collective(p, [&] { lib_.barrier(); }));
    add_row("barrier", 0, us, 0);
  }

  // Ranks 0 and 1 bounce `bytes`; the figure is half a round trip (one-way
  // latency), its bandwidth bytes per one-way time. The other ranks wait.
  void pingpong_row(size_t bytes) {
    const Policy p = policy_for(bytes, options_.quick);
    const int rank = lib_.rank();
    Buffer data(bytes);
    std::vector<double> samples(static_cast<size_t>(p.samples), 0.0);
    if (rank <= 1) {
      auto round_trip = [&] {
        if (rank == 0) {
          lib_.send(data.bytes(), bytes, 1);
          lib_.recv(data.bytes(), bytes, 1);
        } else {
          lib_.recv(data.bytes(), bytes, 0);
          lib_.send(data.bytes(), bytes, 0);
        }
      };
      for (int i = 0; i < p.warmup_calls; ++i) round_trip();
      for (int s = 0; s < p.samples; ++s) {
        const double start = now_us();
        for (int c = 0; c < p.calls; ++c) round_trip();
        samples[static_cast<size_t>(s)] = (now_us() - start) / p.calls / 2;
      }
      check_pingpong(data, bytes);
    }
    lib_.idle_barrier();
    const double us = slowest_rank_median(samples);
    add_row("pingpong", bytes, us, 1.0);
  }

  void check_pingpong(Buffer& data, size_t bytes) {
    if (lib_.rank() == 0) {
      for (size_t i = 0; i < bytes; ++i) data.bytes()[i] = pattern(i, 3);
      lib_.send(data.bytes(), bytes, 1);
      std::memset(data.bytes(), 0, bytes);
      lib_.recv(data.bytes(), bytes, 1);
    } else {
      std::memset(data.bytes(), 0, bytes);
      lib_.recv(data.bytes(), bytes, 0);
      lib_.send(data.bytes(), bytes, 0);
    }
    for (size_t i = 0; i < bytes; ++i) {
      if (data.bytes()[i] != pattern(i, 3)) fail("pingpong", bytes, "byte " + std::to_string(i) + " came back changed");
    }
  }

  // The floor: one process copies `bytes` with memcpy while the other
  // ranks wait. Many more calls per sample than the collectives, since a
  // small memcpy takes nanoseconds.
  void memcpy_row(size_t bytes) {
    if (lib_.rank() == 0) {
      Buffer src(bytes), dst(bytes);
      for (size_t i = 0; i < bytes; ++i) src.bytes()[i] = pattern(i, 5);
      Policy p = policy_for(bytes, options_.quick);
      p.calls = static_cast<int>(std::clamp<size_t>(64 * kMiB / bytes, 1, options_.quick ? 1000 : 100000));
      for (int i = 0; i < p.warmup_calls; ++i) {
        std::memcpy(dst.bytes(), src.bytes(), bytes);
        clobber(dst.bytes());
      }
      std::vector<double> samples;
      for (int s = 0; s < p.samples; ++s) {
        const double start = now_us();
        for (int c = 0; c < p.calls; ++c) {
          std::memcpy(dst.bytes(), src.bytes(), bytes);
          clobber(dst.bytes());
        }
        samples.push_back((now_us() - start) / p.calls);
      }
      if (std::memcmp(dst.bytes(), src.bytes(), bytes) != 0) fail("memcpy", bytes, "the copy differs");
      add_row("memcpy", bytes, median(samples), 1.0);
    }
    lib_.idle_barrier();
  }

  void print_header() const {
    const std::string prefix = options_.tsv ? "info\t" : "";
    std::printf("%slibrary\t%s\n", prefix.c_str(), lib_.name().c_str());
    std::printf("%sranks\t%d\n", prefix.c_str(), lib_.size());
    for (const std::string& line : lib_.describe()) std::printf("%ssetup\t%s\n", prefix.c_str(), line.c_str());
    std::printf("%spolicy\t%s\n", prefix.c_str(),
                options_.quick ? "quick (smoke run, not a measurement)"
                               : "warm-up, then median over 15 samples (5-9 above 1 MiB) of the slowest rank's "
                                 "mean per call in a batch");
    std::fflush(stdout);
  }

  void print_rows() const {
    if (options_.tsv) {
      for (const Row& r : rows_) std::printf("row\t%s\t%zu\t%.6f\t%.4f\n", r.op.c_str(), r.bytes, r.us, r.busbw_gbps);
      for (const std::string& text : notes_) std::printf("note\t%s\n", text.c_str());
      std::fflush(stdout);
      return;
    }
    std::string op;
    for (const Row& r : rows_) {
      if (r.op != op) {
        op = r.op;
        std::printf("\n%s (%s, %d ranks)\n%10s %12s %12s\n", op.c_str(), lib_.name().c_str(), lib_.size(), "size",
                    op == "pingpong" ? "one-way us" : "us", op == "barrier" ? "" : "GB/s");
      }
      std::printf("%10s %12.2f", size_label(r.bytes).c_str(), r.us);
      if (r.op != "barrier") std::printf(" %12.3f", r.busbw_gbps);
      std::printf("\n");
    }
    for (const std::string& text : notes_) std::printf("note: %s\n", text.c_str());
    std::fflush(stdout);
  }

  CollectiveLibrary& lib_;
  const SuiteOptions& options_;
  std::vector<Row> rows_;
  std::vector<std::string> notes_;
};

bool parse_bytes(std::string_view text, size_t& out) {
  size_t scale = 1;
  for (auto [suffix, factor] : {std::pair<std::string_view, size_t>{"KiB", 1024}, {"MiB", kMiB}, {"K", 1024}, {"M", kMiB}}) {
    if (text.size() > suffix.size() && text.substr(text.size() - suffix.size()) == suffix) {
      text.remove_suffix(suffix.size());
      scale = factor;
      break;
    }
  }
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string_view::npos) return false;
  out = std::stoull(std::string(text)) * scale;
  return true;
}

}  // namespace

std::string suite_usage(const std::string& program) {
  return "usage: mpirun -n N " + program +
         " [--quick] [--tsv] [--max-bytes=BYTES[K|M]] [--ops=OP,...]\n"
         "  OP: allreduce broadcast allgather barrier pingpong memcpy (default: all)\n"
         "  sizes: 8 B, 64 B, 256 B, 1 KiB ... 64 MiB (x4), up to --max-bytes\n";
}

bool parse_suite_options(int argc, char** argv, SuiteOptions& options, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--tsv") {
      options.tsv = true;
    } else if (arg.starts_with("--max-bytes=")) {
      if (!parse_bytes(arg.substr(12), options.max_bytes)) {
        error = "--max-bytes wants a byte count like 65536, 64K or 16M, not '" + std::string(arg.substr(12)) + "'";
        return false;
      }
    } else if (arg.starts_with("--ops=")) {
      std::string_view list = arg.substr(6);
      while (!list.empty()) {
        const size_t comma = list.find(',');
        const std::string_view op = list.substr(0, comma);
        if (std::find(std::begin(kOps), std::end(kOps), op) == std::end(kOps)) {
          error = "unknown op '" + std::string(op) + "' in --ops";
          return false;
        }
        options.ops.emplace_back(op);
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
    } else {
      error = arg == "--help" ? "" : "unknown argument '" + std::string(arg) + "'";
      return false;
    }
  }
  return true;
}

int run_suite(CollectiveLibrary& library, const SuiteOptions& options) { return Suite(library, options).run(); }

}  // namespace castmesh_bench
