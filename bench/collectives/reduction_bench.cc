// Reduction kernels (issue 12, "reductions vectorised"): GB/s of
// Reduction::combine(in, inout, n) against memcpy of the same buffer size,
// measured in the same run so the ratio is the meaningful figure: a combine
// reads two buffers and writes one, a memcpy reads one and writes one.
//
// GB/s = buffer bytes (n * dtype size) / time, for combine and memcpy alike.
// Google Benchmark flags work as usual (--benchmark_filter,
// --benchmark_repetitions, --benchmark_min_time); the table at the end takes
// the median of the repetitions. The kernels are the table the CPU runs best
// (printed first); CASTMESH_REDUCTION_ISA=portable measures the portable one.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "castmesh/detail/reduction_isa.h"
#include "castmesh/reduction.h"

namespace {

using castmesh::DType;
using castmesh::ReduceOp;

struct Case {
  ReduceOp op;
  DType dtype;
};

constexpr Case kCases[] = {
    {ReduceOp::kSum, DType::kFloat32}, {ReduceOp::kSum, DType::kFloat16}, {ReduceOp::kSum, DType::kBFloat16},
    {ReduceOp::kSum, DType::kInt32},   {ReduceOp::kMax, DType::kFloat32},
};
constexpr size_t kSizes[] = {4 << 10, 256 << 10, 16 << 20};

// A page-aligned buffer of `bytes` filled with small values of `dtype` (no
// NaN, no subnormal: the kernels have no data-dependent paths, but the FPU
// might for subnormals).
struct Buffer {
  Buffer(size_t bytes, DType dtype, float value)
      : data(static_cast<unsigned char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    const size_t n = bytes / castmesh::dtype_size(dtype);
    for (size_t i = 0; i < n; ++i) {
      const float v = value * static_cast<float>(1 + i % 7);
      switch (dtype) {
        case DType::kFloat32: reinterpret_cast<float*>(data)[i] = v; break;
        case DType::kFloat16: reinterpret_cast<uint16_t*>(data)[i] = castmesh::float_to_half(v); break;
        case DType::kBFloat16: reinterpret_cast<uint16_t*>(data)[i] = castmesh::float_to_bfloat16(v); break;
        case DType::kInt32: reinterpret_cast<int32_t*>(data)[i] = static_cast<int32_t>(i % 1000); break;
        default: std::memset(data, 0, bytes); return;
      }
    }
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* data;
};

void bm_combine(benchmark::State& state, Case c) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / castmesh::dtype_size(c.dtype);
  absl::StatusOr<castmesh::Reduction> red = castmesh::Reduction::Builtin(c.op, c.dtype);
  if (!red.ok()) {
    state.SkipWithError(std::string(red.status().message()).c_str());
    return;
  }
  Buffer in(bytes, c.dtype, 0.001f), inout(bytes, c.dtype, 0.5f);
  for (auto _ : state) {
    red->combine(in.data, inout.data, n);
    benchmark::DoNotOptimize(inout.data);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void bm_memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffer src(bytes, DType::kFloat32, 1.0f), dst(bytes, DType::kFloat32, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data, src.data, bytes);
    benchmark::DoNotOptimize(dst.data);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// Names are formatted with snprintf: GCC 12 at -O3 warns falsely
// (-Wrestrict) about std::string's operator+ with a literal.
std::string format(const char* fmt, auto... args) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

std::string case_name(const Case& c) {
  const std::string_view op = castmesh::reduce_op_name(c.op), dtype = castmesh::dtype_name(c.dtype);
  return format("%.*s_%.*s", static_cast<int>(op.size()), op.data(), static_cast<int>(dtype.size()), dtype.data());
}

// The console output as usual, plus each run's bytes/s kept by name.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) rates_[run.benchmark_name()].push_back(it->second.value);
    }
    ConsoleReporter::ReportRuns(runs);
  }

  // Median GB/s of the runs called `name`, or 0 if none ran.
  double gbps(const std::string& name) const {
    const auto it = rates_.find(name);
    if (it == rates_.end() || it->second.empty()) return 0;
    std::vector<double> v = it->second;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] / 1e9;
  }

 private:
  std::map<std::string, std::vector<double>> rates_;
};

std::string size_name(size_t bytes) {
  return bytes >= (1 << 20) ? format("%zu MiB", bytes >> 20) : format("%zu KiB", bytes >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Case& c : kCases) {
    auto* b = benchmark::RegisterBenchmark(format("combine/%s", case_name(c).c_str()).c_str(), bm_combine, c);
    for (size_t s : kSizes) b->Arg(static_cast<int64_t>(s));
  }
  auto* m = benchmark::RegisterBenchmark("memcpy", bm_memcpy);
  for (size_t s : kSizes) m->Arg(static_cast<int64_t>(s));

  std::printf("reduction kernels: %s\n", castmesh::detail::reduction_kernel_isa());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\n%-16s %8s | %14s %13s | %s\n", "combine", "size", "combine GB/s", "memcpy GB/s", "combine/memcpy");
  for (const Case& c : kCases) {
    for (size_t s : kSizes) {
      const double comb = reporter.gbps(format("combine/%s/%zu", case_name(c).c_str(), s));
      const double copy = reporter.gbps(format("memcpy/%zu", s));
      if (comb == 0) continue;
      std::printf("%-16s %8s | %14.2f %13.2f | %.2fx\n", case_name(c).c_str(), size_name(s).c_str(), comb, copy,
                  copy > 0 ? comb / copy : 0.0);
    }
  }
  return 0;
}
