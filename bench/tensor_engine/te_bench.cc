// castmesh_te_bench: device collectives and copies through castmesh against
// the same backend calls made directly (issue 14's benchmark). One process,
// one rank per GPU (an in-process actor mesh for castmesh; one thread per
// rank for the direct calls, which are the tensor_engine table's thin
// wrappers of ncclAllReduce / cudaMemcpyAsync):
//   - allreduce (sum, float32) bus bandwidth at large sizes and per-call
//     latency at 8 B: Communicator::allreduce (enqueue + CPU wait) against
//     table->allreduce + stream_synchronize;
//   - host<->device copy bandwidth (pinned host memory): castmesh::device_copy
//     against table->copy.
// Without a GPU (or without the tensor_engine backend) it says so and exits 0.
//
//   castmesh_te_bench [--ranks=N] [--iters=N] [--max-mib=64]
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "castmesh/actor_mesh.h"
#include "castmesh/backend.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"

namespace {

using castmesh::Communicator;
using castmesh::Device;
using castmesh::DeviceKind;
using castmesh::DeviceStream;
using castmesh::DType;
using castmesh::TensorView;
using Clock = std::chrono::steady_clock;

struct Options {
  int ranks = 0;  // 0: every device
  int iters = 20;
  int64_t max_mib = 64;
};

[[noreturn]] void die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "castmesh_te_bench: %s: %s\n", what.c_str(), std::string(st.ToString()).c_str());
  std::exit(1);
}
void check(const std::string& what, const absl::Status& st) {
  if (!st.ok()) die(what, st);
}
void check_te(const char* what, int32_t code, const castmesh_error_v1& error) {
  if (code != CASTMESH_STATUS_OK) die(what, absl::InternalError(error.message));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The sizes measured: 8 B, then 1 MiB doubling to max_mib.
std::vector<int64_t> sizes(const Options& o) {
  std::vector<int64_t> out = {8};
  for (int64_t b = int64_t{1} << 20; b <= (o.max_mib << 20); b *= 4) out.push_back(b);
  return out;
}

// ---- direct: the backend table on one thread per rank ----

double direct_allreduce(const castmesh_tensor_engine_table_v1& te, DeviceKind kind, int ranks, int64_t bytes,
                        int iters) {
  castmesh_error_v1 error{};
  castmesh_te_unique_id_v1 id{};
  check_te("comm_unique_id", te.comm_unique_id(&id, &error), error);
  std::vector<double> seconds(ranks);
  std::barrier<> start(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      castmesh_error_v1 e{};
      castmesh_te_comm_v1* comm = nullptr;
      castmesh_te_stream_v1* stream = nullptr;
      check_te("comm_create", te.comm_create(r, &id, ranks, r, &comm, &e), e);
      check_te("stream_create", te.stream_create(r, &stream, &e), e);
      absl::StatusOr<TensorView> buf = castmesh::device_empty(DType::kFloat32, {bytes / 4 > 0 ? bytes / 4 : 1},
                                                              Device{kind, r});
      check("device_empty", buf.status());
      const uint64_t count = static_cast<uint64_t>(buf->numel());
      check_te("warm-up", te.allreduce(comm, buf->data(), buf->data(), count, CASTMESH_TE_DTYPE_FLOAT32,
                                       CASTMESH_TE_REDUCE_SUM, stream, &e), e);
      check_te("sync", te.stream_synchronize(stream, &e), e);
      start.arrive_and_wait();
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        check_te("allreduce", te.allreduce(comm, buf->data(), buf->data(), count, CASTMESH_TE_DTYPE_FLOAT32,
                                           CASTMESH_TE_REDUCE_SUM, stream, &e), e);
        check_te("sync", te.stream_synchronize(stream, &e), e);
      }
      seconds[r] = seconds_since(t0) / iters;
      te.stream_destroy(stream, &e);
      te.comm_destroy(comm, &e);
    });
  }
  for (std::thread& t : threads) t.join();
  double worst = 0;
  for (double s : seconds) worst = std::max(worst, s);
  return worst;
}

// ---- castmesh: Communicator::allreduce in an in-process mesh ----

struct Measure {
  int64_t bytes;
  int iters;
};
// Checks results before measuring: allreduce, broadcast and allgather on a
// non-default stream, against values computed here.
struct Verify {
  int64_t count;
};

class Rank : public castmesh::Actor {
 public:
  double run(const Measure& m) {
    Communicator comm = *Communicator::current();
    const Device device{kind(), comm.rank()};
    absl::StatusOr<TensorView> buf = castmesh::device_empty(DType::kFloat32, {m.bytes / 4 > 0 ? m.bytes / 4 : 1}, device);
    check("device_empty", buf.status());
    absl::StatusOr<DeviceStream> stream = DeviceStream::Create(device);
    check("stream", stream.status());
    castmesh::DeviceOptions options;
    options.stream = *stream;
    check("warm-up", comm.allreduce(*buf, *buf, castmesh::ReduceOp::kSum, options));
    check("barrier", comm.barrier());
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < m.iters; ++i) check("allreduce", comm.allreduce(*buf, *buf, castmesh::ReduceOp::kSum, options));
    return seconds_since(t0) / m.iters;
  }
  std::string verify(const Verify& v) {
    Communicator comm = *Communicator::current();
    const int r = comm.rank();
    const int n = comm.size();
    const Device device{kind(), r};
    absl::StatusOr<DeviceStream> stream = DeviceStream::Create(device);
    absl::StatusOr<TensorView> buf = castmesh::device_empty(DType::kFloat32, {v.count}, device);
    absl::StatusOr<TensorView> all = castmesh::device_empty(DType::kFloat32, {v.count * n}, device);
    if (!stream.ok() || !buf.ok() || !all.ok()) return "setup failed";
    castmesh::DeviceOptions options;
    options.stream = *stream;
    std::vector<float> host(static_cast<size_t>(v.count));
    std::vector<float> gathered(static_cast<size_t>(v.count * n));
    auto put = [&](float base) {
      for (int64_t i = 0; i < v.count; ++i) host[i] = base + static_cast<float>(i % 7);
      return castmesh::device_copy(*buf, TensorView::Contiguous(host.data(), DType::kFloat32, {v.count}), *stream);
    };
    auto get = [&](const TensorView& t, std::vector<float>& out) {
      absl::Status st = castmesh::device_copy(TensorView::Contiguous(out.data(), DType::kFloat32, {t.numel()}), t,
                                              *stream);
      return st.ok() ? stream->synchronize() : st;
    };
    // allreduce: sum over ranks of (rank + 1 + i % 7).
    if (absl::Status st = put(r + 1.0f); !st.ok()) return st.ToString();
    castmesh::Request req = comm.iallreduce(*buf, *buf, castmesh::ReduceOp::kSum, options);
    if (absl::Status st = req.wait_stream(*stream); !st.ok()) return st.ToString();
    if (absl::Status st = get(*buf, host); !st.ok()) return st.ToString();
    for (int64_t i = 0; i < v.count; ++i) {
      const float want = n * (n + 1) / 2.0f + n * static_cast<float>(i % 7);
      if (host[i] != want) return "allreduce: element " + std::to_string(i) + " is " + std::to_string(host[i]);
    }
    // broadcast from the last rank.
    if (absl::Status st = put(100.0f * r); !st.ok()) return st.ToString();
    if (absl::Status st = comm.broadcast(*buf, n - 1, options); !st.ok()) return st.ToString();
    if (absl::Status st = get(*buf, host); !st.ok()) return st.ToString();
    if (host[1] != 100.0f * (n - 1) + 1) return "broadcast: got " + std::to_string(host[1]);
    // allgather: block k holds rank k's values.
    if (absl::Status st = put(10.0f * r); !st.ok()) return st.ToString();
    if (absl::Status st = comm.allgather(*buf, *all, options); !st.ok()) return st.ToString();
    if (absl::Status st = get(*all, gathered); !st.ok()) return st.ToString();
    for (int k = 0; k < n; ++k) {
      if (gathered[k * v.count] != 10.0f * k) return "allgather: block " + std::to_string(k) + " is wrong";
    }
    return "";
  }
  static DeviceKind kind() {
    absl::StatusOr<std::vector<castmesh::DeviceInfo>> d = castmesh::device_list();
    return d.ok() && !d->empty() && d->front().kind == CASTMESH_DEVICE_KIND_HIP ? DeviceKind::kRocm : DeviceKind::kCuda;
  }
  using Handlers = castmesh::Handlers<&Rank::run, &Rank::verify>;
};

// ---- copies ----

void copies(const castmesh_tensor_engine_table_v1& te, DeviceKind kind, int64_t bytes, int iters) {
  castmesh_error_v1 e{};
  void* pinned = nullptr;
  check_te("pinned_alloc", te.pinned_alloc(static_cast<uint64_t>(bytes), &pinned, &e), e);
  absl::StatusOr<TensorView> dev = castmesh::device_empty(DType::kUInt8, {bytes}, Device{kind, 0});
  check("device_empty", dev.status());
  absl::StatusOr<DeviceStream> stream = DeviceStream::Create(Device{kind, 0});
  check("stream", stream.status());
  TensorView host = TensorView::Contiguous(pinned, DType::kUInt8, {bytes});
  for (int direction = 0; direction < 2; ++direction) {
    const bool h2d = direction == 0;
    double through[2] = {0, 0};
    // Untimed first: the first touch of fresh memory faults its pages in.
    check("warm-up", h2d ? castmesh::device_copy(*dev, host, *stream) : castmesh::device_copy(host, *dev, *stream));
    check("sync", stream->synchronize());
    for (int way = 0; way < 2; ++way) {
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (way == 0) {
          check("device_copy", h2d ? castmesh::device_copy(*dev, host, *stream) : castmesh::device_copy(host, *dev, *stream));
        } else {
          check_te("copy", te.copy(h2d ? dev->data() : pinned, h2d ? pinned : dev->data(), static_cast<uint64_t>(bytes),
                                   h2d ? CASTMESH_TE_COPY_HOST_TO_DEVICE : CASTMESH_TE_COPY_DEVICE_TO_HOST,
                                   stream->handle(), &e), e);
        }
      }
      check("sync", stream->synchronize());
      through[way] = static_cast<double>(bytes) * iters / seconds_since(t0) / 1e9;
    }
    std::printf("copy %s %6lld MiB   castmesh %7.2f GB/s   direct %7.2f GB/s\n", h2d ? "H2D" : "D2H",
                static_cast<long long>(bytes >> 20), through[0], through[1]);
  }
  te.pinned_free(pinned, &e);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--ranks=", 0) == 0) o.ranks = std::atoi(a.c_str() + 8);
    else if (a.rfind("--iters=", 0) == 0) o.iters = std::max(1, std::atoi(a.c_str() + 8));
    else if (a.rfind("--max-mib=", 0) == 0) o.max_mib = std::max<int64_t>(1, std::atoll(a.c_str() + 10));
    else {
      std::fprintf(stderr, "usage: castmesh_te_bench [--ranks=N] [--iters=N] [--max-mib=N]\n");
      return 2;
    }
  }
  absl::StatusOr<std::vector<castmesh::DeviceInfo>> devices = castmesh::device_list();
  if (!devices.ok() || devices->empty()) {
    std::printf("castmesh_te_bench needs a GPU and the tensor_engine backend; skipping (%s)\n",
                devices.ok() ? "no device" : std::string(devices.status().message()).c_str());
    return 0;
  }
  absl::StatusOr<const castmesh::Backend*> backend = castmesh::load_backend("tensor_engine");
  const castmesh_tensor_engine_table_v1& te = *castmesh::tensor_engine_table(**backend);
  const DeviceKind kind = Rank::kind();
  const int ranks = o.ranks > 0 ? std::min<int>(o.ranks, static_cast<int>(devices->size()))
                                : static_cast<int>(devices->size());
  std::printf("castmesh_te_bench: backend %s, %d rank(s) on %s, %d iterations per size\n",
              (*backend)->info().version.c_str(), ranks, devices->front().name.c_str(), o.iters);
  copies(te, kind, o.max_mib << 20, o.iters);

  // More workers than ranks: each rank blocks its worker while it waits.
  castmesh::Runtime runtime(castmesh::RuntimeOptions{.workers = ranks + 2});
  castmesh::MeshOptions mesh_options;
  mesh_options.name = "te_bench";
  auto mesh = castmesh::ActorMesh<Rank>::Spawn(runtime, *castmesh::Shape::Create({{"gpus", size_t(ranks)}}),
                                               mesh_options);
  check("spawn", mesh.status());
  auto verified = mesh->call(Verify{int64_t{1} << 18}).get(absl::Minutes(2));
  check("verify", verified.status());
  for (const std::string& problem : verified->values()) {
    if (!problem.empty()) {
      std::fprintf(stderr, "castmesh_te_bench: wrong result: %s\n", problem.c_str());
      return 1;
    }
  }
  std::printf("results checked on a non-default stream: allreduce, broadcast, allgather (%d ranks)\n", ranks);
  std::printf("%12s %14s %14s %12s %12s %10s\n", "bytes", "castmesh us", "direct us", "castmesh GB/s",
              "direct GB/s", "overhead");
  for (int64_t bytes : sizes(o)) {
    auto values = mesh->call(Measure{bytes, o.iters}).get(absl::Minutes(5));
    check("castmesh allreduce", values.status());
    double ours = 0;
    for (double s : values->values()) ours = std::max(ours, s);
    const double direct = direct_allreduce(te, kind, ranks, bytes, o.iters);
    // NCCL's bus bandwidth: 2 (n-1)/n of the bytes cross each link.
    const double factor = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0;
    std::printf("%12lld %14.2f %14.2f %12.2f %12.2f %9.1f%%\n", static_cast<long long>(bytes), ours * 1e6,
                direct * 1e6, bytes * factor / ours / 1e9, bytes * factor / direct / 1e9,
                (ours - direct) / direct * 100);
  }
  mesh->stop();
  return 0;
}
