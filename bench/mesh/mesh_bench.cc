// Cast and call latency to meshes of 1, 4, 16 and 64 actors, through the cast
// tree (fan-out 8), by direct fan-out through the forwarders (fan-out >=
// size: the sender messages every member's forwarder), and the naive loop a
// user would write without a mesh (tell/ask every member ref, when_all), in
// one run.
//
//   build/release/bench/mesh/castmesh_mesh_bench [--iters=N] [--repeat=N] [--workers=N] [--procs=N]
//
// Second table (--procs=N, default 4; 0 skips it): the same meshes with the
// members in N worker procs (this binary re-executed), size/N actors per
// proc (one contiguous run of ranks each), cast along the per-proc tree of
// cast relays (fan-out 2, so 4 procs make a tree of depth 2), by direct
// fan-out to every proc's relay (fan-out >= procs), and by the naive loop
// (one wire message per member). There the members cannot signal the
// controller directly, so cast is measured pipelined: K casts, then one call
// that is ordered after them (cast_us = total / K). msgs = wire messages the
// controller's proc sent per cast (its ProcHost's counter).
//
// Each cell is measured --repeat times (default 5) and the median printed,
// because a shared 2-core machine is noisy. Columns (mean over the
// iterations of one measurement, microseconds):
//   cast_us    one cast until every member has handled it
//   send_us    time spent by the sender inside cast() (its own cost)
//   call_us    call(msg).get(): every member answers, ValueMesh assembled
//   reduce_us  call(msg, sum).get(): replies folded up the tree
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <condition_variable>
#include <mutex>
#include "absl/strings/str_cat.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/detail/embedding.h"
#include "castmesh/proc_mesh.h"

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

// --- members in worker procs ---------------------------------------------
struct RPing {};
struct RGet {};
absl::Status encode_empty_ping(const RPing&, std::string* out) { return out->clear(), absl::OkStatus(); }
absl::Status decode_empty_ping(std::string_view, RPing*) { return absl::OkStatus(); }
absl::Status encode_empty_get(const RGet&, std::string* out) { return out->clear(), absl::OkStatus(); }
absl::Status decode_empty_get(std::string_view, RGet*) { return absl::OkStatus(); }

}  // namespace
CASTMESH_REGISTER_MESSAGE(RPing, "castmesh.bench.mesh.Ping", encode_empty_ping, decode_empty_ping);
CASTMESH_REGISTER_MESSAGE(RGet, "castmesh.bench.mesh.Get", encode_empty_get, decode_empty_get);
namespace {

class RemoteMember : public castmesh::Actor {
 public:
  void ping(const RPing&) { ++pings_; }
  int64_t get(const RGet&) { return 1; }
  using Handlers = castmesh::Handlers<&RemoteMember::ping, &RemoteMember::get>;

 private:
  int64_t pings_ = 0;
};

}  // namespace
CASTMESH_REGISTER_ACTOR(RemoteMember);
namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

struct Row {
  double cast_us = 0, send_us = 0, call_us = 0, reduce_us = 0, msgs = 0;
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

Row measure_remote(const castmesh::ActorMesh<RemoteMember>& mesh, int iters, bool naive) {
  Row row;
  const std::vector<castmesh::ActorRef<RemoteMember>> refs = mesh.refs();
  auto call_all = [&]() -> int64_t {
    if (!naive) {
      auto r = mesh.call(RGet{}, castmesh::reducers::sum<int64_t>()).get();
      if (!r.ok()) {
        std::fprintf(stderr, "reduce: %s\n", r.status().ToString().c_str());
        std::abort();
      }
      return *r;
    }
    std::vector<castmesh::Future<int64_t>> futures;
    for (const auto& r : refs) futures.push_back(r.ask(RGet{}));
    auto all = castmesh::when_all(std::move(futures)).get();
    if (!all.ok()) {
      std::fprintf(stderr, "naive call: %s\n", all.status().ToString().c_str());
      std::abort();
    }
    int64_t sum = 0;
    for (int64_t v : *all) sum += v;
    return sum;
  };
  for (int i = 0; i < iters / 10 + 1; ++i) call_all();  // warm up
  const castmesh::Runtime& runtime = *castmesh::Runtime::current();
  const bool is_proc = castmesh::detail::proc_identity(runtime).has_value();
  const uint64_t sent_before = castmesh::detail::proc_messages_sent(runtime);
  double send_total = 0;
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    auto t = Clock::now();
    if (naive) {
      for (const auto& r : refs) r.tell(RPing{});
    } else {
      (void)mesh.cast(RPing{});
    }
    send_total += us_since(t);
  }
  if (is_proc) row.msgs = static_cast<double>(castmesh::detail::proc_messages_sent(runtime) - sent_before) / iters;
  if (call_all() != static_cast<int64_t>(refs.size())) std::abort();
  row.cast_us = us_since(start) / iters;
  row.send_us = send_total / iters;
  start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (naive) {
      std::vector<castmesh::Future<int64_t>> futures;
      for (const auto& r : refs) futures.push_back(r.ask(RGet{}));
      if (!castmesh::when_all(std::move(futures)).get().ok()) std::abort();
    } else if (!mesh.call(RGet{}).get().ok()) {
      std::abort();
    }
  }
  row.call_us = us_since(start) / iters;
  start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (call_all() != static_cast<int64_t>(refs.size())) std::abort();
  }
  row.reduce_us = us_since(start) / iters;
  return row;
}

// The median of each column over `rows`.
Row median(std::vector<Row> rows) {
  auto med = [&](double Row::*field) {
    std::vector<double> v;
    for (const Row& r : rows) v.push_back(r.*field);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  Row out;
  out.cast_us = med(&Row::cast_us);
  out.send_us = med(&Row::send_us);
  out.call_us = med(&Row::call_us);
  out.reduce_us = med(&Row::reduce_us);
  out.msgs = med(&Row::msgs);
  return out;
}

}  // namespace

int run_remote(castmesh::Runtime& runtime, castmesh::ProcMesh& procs, int iters, int repeat);

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs never return from here
  int iters = 2000;
  int procs = 4;
  int workers = 0;
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--workers=", 10) == 0) workers = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--procs=", 8) == 0) procs = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--repeat=", 9) == 0) repeat = std::max(1, std::atoi(argv[i] + 9));
  }
  castmesh::RuntimeOptions options;
  options.workers = workers;
  castmesh::Runtime runtime(options);
  // The runtime must become a proc before it spawns anything.
  absl::StatusOr<castmesh::ProcMesh> proc_mesh;
  if (procs > 0) {
    proc_mesh = castmesh::LocalAllocator().allocate(runtime, procs);
    if (!proc_mesh.ok()) {
      std::fprintf(stderr, "allocate: %s\n", proc_mesh.status().ToString().c_str());
      return 1;
    }
  }
  std::printf("castmesh mesh bench: median of %d x %d iterations per cell, %d runtime workers, in-process actors\n",
              repeat, iters, runtime.worker_count());
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
      std::vector<Row> rows;
      for (int r = 0; r < repeat; ++r) {
        if (std::strcmp(mode, "naive-loop") == 0) {
          rows.push_back(measure_naive(*mesh, arrivals, iters));
        } else {
          castmesh::ActorMesh<Member> m = std::strcmp(mode, "direct") == 0 ? mesh->with_fanout(size) : *mesh;
          rows.push_back(measure(m, arrivals, iters));
        }
      }
      Row row = median(std::move(rows));
      std::printf("%6zu  %-12s %10.2f %10.2f %10.2f %10.2f\n", size, mode, row.cast_us, row.send_us,
                  row.call_us, row.reduce_us);
      std::fflush(stdout);
    }
    mesh->stop();
  }
  if (procs > 0) return run_remote(runtime, *proc_mesh, iters, repeat);
  return 0;
}

int run_remote(castmesh::Runtime& runtime, castmesh::ProcMesh& proc_mesh, int iters, int repeat) {
  castmesh::ProcMesh* procs = &proc_mesh;
  const int nprocs = static_cast<int>(proc_mesh.size());
  iters = std::max(1, iters / 4);
  std::printf("\nmembers in %d worker procs (unix sockets), per-proc cast relays; median of %d x %d;\n"
              "cast_us = pipelined cast cost (K casts + one ordered call) / K; msgs = controller wire messages per cast\n",
              nprocs, repeat, iters);
  std::printf("%6s %5s  %-12s %10s %10s %10s %10s %6s\n", "actors", "procs", "delivery", "cast_us", "send_us",
              "call_us", "reduce_us", "msgs");
  int mesh_id = 0;
  for (size_t size : {1u, 4u, 16u, 64u}) {
    const size_t used = std::min<size_t>(size, static_cast<size_t>(nprocs));
    const size_t per_proc = size / used;
    // Members (p, j): the j-th actor spawned on proc p; row-major {procs, local}.
    std::vector<std::vector<castmesh::ActorRef<RemoteMember>>> spawned;
    for (size_t j = 0; j < per_proc; ++j) {
      auto refs = procs->spawn<RemoteMember>(absl::StrCat("rm", mesh_id, "_", j));
      if (!refs.ok()) {
        std::fprintf(stderr, "spawn: %s\n", refs.status().ToString().c_str());
        return 1;
      }
      spawned.push_back(*refs);
    }
    std::vector<castmesh::ActorRef<RemoteMember>> members;
    for (size_t p = 0; p < used; ++p) {
      for (size_t j = 0; j < per_proc; ++j) members.push_back(spawned[j][p]);
    }
    castmesh::Shape shape = *castmesh::Shape::Create({{"procs", used}, {"local", per_proc}});
    castmesh::MeshOptions options;
    options.name = absl::StrCat("remote", mesh_id++);
    options.fanout = 2;
    auto mesh = castmesh::ActorMesh<RemoteMember>::Create(runtime, shape, members, options);
    if (!mesh.ok()) {
      std::fprintf(stderr, "mesh: %s\n", mesh.status().ToString().c_str());
      return 1;
    }
    for (const char* mode : {"tree(f=2)", "direct", "naive-loop"}) {
      std::vector<Row> rows;
      for (int r = 0; r < repeat; ++r) {
        bool naive = std::strcmp(mode, "naive-loop") == 0;
        castmesh::ActorMesh<RemoteMember> m = std::strcmp(mode, "direct") == 0 ? mesh->with_fanout(size) : *mesh;
        rows.push_back(measure_remote(m, iters, naive));
      }
      Row row = median(std::move(rows));
      std::printf("%6zu %5zu  %-12s %10.2f %10.2f %10.2f %10.2f %6.1f\n", size, used, mode, row.cast_us,
                  row.send_us, row.call_us, row.reduce_us, row.msgs);
      std::fflush(stdout);
    }
  }
  return procs->stop().ok() ? 0 : 1;
}
