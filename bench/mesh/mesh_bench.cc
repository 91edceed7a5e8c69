// Cast and call latency to meshes of 1, 4, 16 and 64 actors, through the cast
// tree (fan-out 8), by direct fan-out through the forwarders (fan-out >=
// size: the sender messages every member's forwarder), and the naive loop a
// user would write without a mesh (tell/ask every member ref, when_all), in
// one run.
//
//   build/release/bench/mesh/castmesh_mesh_bench [--iters=N] [--workers=N]
//
// Columns (means over the iterations, microseconds):
//   cast_us    one cast until every member has handled it
//   send_us    time spent by the sender inside cast() (its own cost)
//   call_us    call(msg).get(): every member answers, ValueMesh assembled
//   reduce_us  call(msg, sum).get(): replies folded up the tree
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <condition_variable>
#include <mutex>
#include "castmesh/actor_mesh.h"

namespace {

// Counts deliveries; the sender waits for a target count.
class Arrivals {
 public:
  void arrive() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++count_;
      if (count_ < target_) return;
    }
    reached_.notify_one();
  }
  void wait_for(uint64_t target) {
    std::unique_lock<std::mutex> lock(mu_);
    target_ = target;
    reached_.wait(lock, [&] { return count_ >= target; });
  }
  uint64_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable reached_;
  uint64_t count_ = 0;   // guarded by mu_
  uint64_t target_ = 0;  // guarded by mu_
};

struct Ping {};
struct Get {};

class Member : public castmesh::Actor {
 public:
  explicit Member(Arrivals* arrivals) : arrivals_(arrivals) {}
  void ping(const Ping&) { arrivals_->arrive(); }
  int64_t get(const Get&) { return 1; }
  using Handlers = castmesh::Handlers<&Member::ping, &Member::get>;

 private:
  Arrivals* arrivals_;
};

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

struct Row {
  double cast_us = 0, send_us = 0, call_us = 0, reduce_us = 0;
};

// The baseline without the mesh layer: the sender messages every member.
Row measure_naive(const castmesh::ActorMesh<Member>& mesh, Arrivals& arrivals, int iters) {
  Row row;
  const std::vector<castmesh::ActorRef<Member>> refs = mesh.refs();
  const uint64_t n = refs.size();
  uint64_t expected = arrivals.count();
  double send_total = 0, cast_total = 0;
  for (int i = 0; i < iters; ++i) {
    expected += n;
    auto start = Clock::now();
    for (const auto& r : refs) r.tell(Ping{});
    send_total += us_since(start);
    arrivals.wait_for(expected);
    cast_total += us_since(start);
  }
  row.cast_us = cast_total / iters;
  row.send_us = send_total / iters;
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    std::vector<castmesh::Future<int64_t>> futures;
    futures.reserve(n);
    for (const auto& r : refs) futures.push_back(r.ask(Get{}));
    if (!castmesh::when_all(std::move(futures)).get().ok()) std::abort();
  }
  row.call_us = us_since(start) / iters;
  start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    std::vector<castmesh::Future<int64_t>> futures;
    futures.reserve(n);
    for (const auto& r : refs) futures.push_back(r.ask(Get{}));
    auto all = castmesh::when_all(std::move(futures)).get();
    int64_t sum = 0;
    for (int64_t v : *all) sum += v;
    if (sum != static_cast<int64_t>(n)) std::abort();
  }
  row.reduce_us = us_since(start) / iters;
  return row;
}

Row measure(castmesh::ActorMesh<Member>& mesh, Arrivals& arrivals, int iters) {
  Row row;
  const uint64_t n = mesh.size();
  for (int i = 0; i < iters / 10 + 1; ++i) {  // warm up
    (void)mesh.call(Get{}).get();
  }
  uint64_t expected = arrivals.count();
  double send_total = 0, cast_total = 0;
  for (int i = 0; i < iters; ++i) {
    expected += n;
    auto start = Clock::now();
    (void)mesh.cast(Ping{});
    send_total += us_since(start);
    arrivals.wait_for(expected);
    cast_total += us_since(start);
  }
  row.cast_us = cast_total / iters;
  row.send_us = send_total / iters;
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (!mesh.call(Get{}).get().ok()) std::abort();
  }
  row.call_us = us_since(start) / iters;
  start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    auto r = mesh.call(Get{}, castmesh::reducers::sum<int64_t>()).get();
    if (!r.ok() || *r != static_cast<int64_t>(n)) std::abort();
  }
  row.reduce_us = us_since(start) / iters;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  int workers = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--workers=", 10) == 0) workers = std::atoi(argv[i] + 10);
  }
  castmesh::RuntimeOptions options;
  options.workers = workers;
  castmesh::Runtime runtime(options);
  std::printf("castmesh mesh bench: %d iterations per cell, %d runtime workers, in-process actors\n", iters,
              runtime.worker_count());
  std::printf("%6s  %-12s %10s %10s %10s %10s\n", "actors", "delivery", "cast_us", "send_us", "call_us",
              "reduce_us");
  Arrivals arrivals;
  int mesh_id = 0;
  for (size_t size : {1u, 4u, 16u, 64u}) {
    castmesh::Shape shape = *castmesh::Shape::Create({{"x", size}});
    castmesh::MeshOptions mesh_options;
    mesh_options.name = "bench" + std::to_string(mesh_id++);
    mesh_options.fanout = 8;
    auto mesh = castmesh::ActorMesh<Member>::Spawn(runtime, shape, mesh_options, &arrivals);
    if (!mesh.ok()) {
      std::fprintf(stderr, "spawn: %s\n", mesh.status().ToString().c_str());
      return 1;
    }
    for (const char* mode : {"tree(f=8)", "direct", "naive-loop"}) {
      Row row;
      if (std::strcmp(mode, "naive-loop") == 0) {
        row = measure_naive(*mesh, arrivals, iters);
      } else {
        castmesh::ActorMesh<Member> m = std::strcmp(mode, "direct") == 0 ? mesh->with_fanout(size) : *mesh;
        row = measure(m, arrivals, iters);
      }
      std::printf("%6zu  %-12s %10.2f %10.2f %10.2f %10.2f\n", size, mode, row.cast_us, row.send_us,
                  row.call_us, row.reduce_us);
      std::fflush(stdout);
    }
    mesh->stop();
  }
  return 0;
}
