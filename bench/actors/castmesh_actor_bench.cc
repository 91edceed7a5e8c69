// The issue 3 actor workloads against castmesh. Mirrors caf_actor_bench.cc
// program for program (see actor_workloads.h for the sizes): actors declare
// typed handlers, tell for one-way messages, ask + Actor::on_complete for
// request/reply inside an actor, ask(...).get() from a plain thread.
#include <castmesh/actor.h>
#include <castmesh/runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "actor_workloads.h"

namespace castmesh::bench {
namespace {

using Clock = std::chrono::steady_clock;

RuntimeOptions runtime_options(const BenchOptions& options) {
  RuntimeOptions o;
  o.workers = options.threads;
  return o;
}

// --- 1. ping-pong -----------------------------------------------------------

struct Ping {
  int64_t n;
};
struct Pong {
  int64_t n;
};
class Pinger;

// Answers every Ping with a Pong to the pinger it was introduced to.
class Ponger : public Actor {
 public:
  struct Introduce {
    ActorRef<Pinger> pinger;
  };
  void introduce(Introduce m) { pinger_ = std::move(m.pinger); }
  void ping(const Ping& m);
  using Handlers = castmesh::Handlers<&Ponger::introduce, &Ponger::ping>;

 private:
  ActorRef<Pinger> pinger_;
};

class Pinger : public Actor {
 public:
  Pinger(ActorRef<Ponger> ponger, int64_t round_trips, std::promise<void>* done)
      : ponger_(std::move(ponger)), round_trips_(round_trips), done_(done) {}
  void on_start() override {
    ponger_.tell(Ponger::Introduce{self_as<Pinger>()});
    ponger_.tell(Ping{0});
  }
  void pong(const Pong& m) {
    if (m.n + 1 == round_trips_) {
      done_->set_value();
      stop();
      return;
    }
    ponger_.tell(Ping{m.n + 1});
  }
  using Handlers = castmesh::Handlers<&Pinger::pong>;

 private:
  ActorRef<Ponger> ponger_;
  int64_t round_trips_;
  std::promise<void>* done_;
};

void Ponger::ping(const Ping& m) { pinger_.tell(Pong{m.n}); }

WorkloadResult ping_pong(const BenchOptions& options) {
  const int64_t round_trips = scaled(kPingPongRoundTrips, options);
  Runtime runtime(runtime_options(options));
  std::promise<void> done;
  const auto start = Clock::now();
  auto ponger = runtime.spawn<Ponger>();
  runtime.spawn<Pinger>(ponger, round_trips, &done);
  done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  ponger.stop();
  char note[64];
  std::snprintf(note, sizeof note, "%.1f ns per round trip", ns_per(elapsed, round_trips));
  return {"ping_pong", 2 * round_trips, ns_per(elapsed, 2 * round_trips), note};
}

// --- 2. N:1 mailbox ---------------------------------------------------------

struct Count {
  int64_t n;
};

class FanInReceiver : public Actor {
 public:
  FanInReceiver(int64_t expected, std::promise<void>* done) : expected_(expected), done_(done) {}
  void count(const Count&) {
    if (++received_ == expected_) {
      done_->set_value();
      stop();
    }
  }
  using Handlers = castmesh::Handlers<&FanInReceiver::count>;

 private:
  int64_t expected_;
  int64_t received_ = 0;
  std::promise<void>* done_;
};

// Sends all its messages as soon as it starts, then stops.
class FanInSender : public Actor {
 public:
  FanInSender(ActorRef<FanInReceiver> receiver, int64_t messages)
      : receiver_(std::move(receiver)), messages_(messages) {}
  void on_start() override {
    for (int64_t i = 0; i < messages_; ++i) receiver_.tell(Count{i});
    stop();
  }
  using Handlers = castmesh::Handlers<>;

 private:
  ActorRef<FanInReceiver> receiver_;
  int64_t messages_;
};

WorkloadResult fan_in(const BenchOptions& options) {
  const int64_t per_sender = scaled(kFanInMessagesPerSender, options);
  const int64_t total = kFanInSenders * per_sender;
  Runtime runtime(runtime_options(options));
  std::promise<void> done;
  const auto start = Clock::now();
  auto receiver = runtime.spawn<FanInReceiver>(total, &done);
  for (int64_t s = 0; s < kFanInSenders; ++s) runtime.spawn<FanInSender>(receiver, per_sender);
  done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  return {"fan_in_20to1", total, ns_per(elapsed, total), ""};
}

// --- 3. spawn rate ----------------------------------------------------------

struct SpawnCount {
  int64_t expected = 0;
  std::atomic<int64_t> stopped{0};
  std::promise<void> done;
};

// Stops as soon as it starts; on_stop counts it.
class SpawnedChild : public Actor {
 public:
  explicit SpawnedChild(SpawnCount* count) : count_(count) {}
  void on_start() override { stop(); }
  void on_stop() override {
    if (count_->stopped.fetch_add(1, std::memory_order_acq_rel) + 1 == count_->expected)
      count_->done.set_value();
  }
  using Handlers = castmesh::Handlers<>;

 private:
  SpawnCount* count_;
};

WorkloadResult spawn(const BenchOptions& options) {
  Runtime runtime(runtime_options(options));
  SpawnCount count;
  count.expected = scaled(kSpawnActors, options);
  const auto start = Clock::now();
  for (int64_t i = 0; i < count.expected; ++i) runtime.spawn<SpawnedChild>(&count);
  count.done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  return {"spawn_stop", count.expected, ns_per(elapsed, count.expected), "per actor"};
}

// --- 4. fork-join throughput (Savina) ---------------------------------------

struct JoinCount {
  std::atomic<int64_t> workers_left{0};
  std::promise<void> done;
};

struct Work {
  int64_t n;
};

class ForkJoinWorker : public Actor {
 public:
  ForkJoinWorker(int64_t expected, JoinCount* join) : expected_(expected), join_(join) {}
  void work(const Work& m) {
    fork_join_work(m.n);
    if (++received_ == expected_) {
      if (join_->workers_left.fetch_sub(1, std::memory_order_acq_rel) == 1) join_->done.set_value();
      stop();
    }
  }
  using Handlers = castmesh::Handlers<&ForkJoinWorker::work>;

 private:
  int64_t expected_;
  int64_t received_ = 0;
  JoinCount* join_;
};

class ForkJoinSender : public Actor {
 public:
  ForkJoinSender(std::vector<ActorRef<ForkJoinWorker>> workers, int64_t per_worker)
      : workers_(std::move(workers)), per_worker_(per_worker) {}
  void on_start() override {
    for (int64_t m = 0; m < per_worker_; ++m)
      for (auto& worker : workers_) worker.tell(Work{m});
    stop();
  }
  using Handlers = castmesh::Handlers<>;

 private:
  std::vector<ActorRef<ForkJoinWorker>> workers_;
  int64_t per_worker_;
};

WorkloadResult fork_join(const BenchOptions& options) {
  const int64_t per_worker = scaled(kForkJoinMessagesPerWorker, options);
  Runtime runtime(runtime_options(options));
  JoinCount join;
  join.workers_left = kForkJoinWorkers;
  const auto start = Clock::now();
  std::vector<ActorRef<ForkJoinWorker>> workers;
  for (int64_t w = 0; w < kForkJoinWorkers; ++w)
    workers.push_back(runtime.spawn<ForkJoinWorker>(per_worker, &join));
  runtime.spawn<ForkJoinSender>(std::move(workers), per_worker);
  join.done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  const int64_t total = kForkJoinWorkers * per_worker;
  return {"fork_join_64", total, ns_per(elapsed, total), ""};
}

// --- 5. ask/reply between actors --------------------------------------------

struct Echo {
  int64_t n;
};

class EchoServer : public Actor {
 public:
  int64_t echo(const Echo& m) { return m.n; }
  using Handlers = castmesh::Handlers<&EchoServer::echo>;
};

// Asks, and asks again from the continuation that on_complete runs inside
// this actor when the answer arrives.
class AskClient : public Actor {
 public:
  AskClient(ActorRef<EchoServer> server, int64_t round_trips, std::promise<void>* done)
      : server_(std::move(server)), round_trips_(round_trips), done_(done) {}
  void on_start() override { ask_next(0); }
  using Handlers = castmesh::Handlers<>;

 private:
  void ask_next(int64_t n) {
    on_complete(server_.ask(Echo{n}), [this](absl::StatusOr<int64_t> reply) {
      if (!reply.ok()) {
        std::fprintf(stderr, "ask failed: %s\n", reply.status().ToString().c_str());
        std::abort();
      }
      if (*reply + 1 == round_trips_) {
        done_->set_value();
        stop();
        return;
      }
      ask_next(*reply + 1);
    });
  }
  ActorRef<EchoServer> server_;
  int64_t round_trips_;
  std::promise<void>* done_;
};

WorkloadResult ask_reply(const BenchOptions& options) {
  const int64_t round_trips = scaled(kAskRoundTrips, options);
  Runtime runtime(runtime_options(options));
  std::promise<void> done;
  const auto start = Clock::now();
  auto server = runtime.spawn<EchoServer>();
  runtime.spawn<AskClient>(server, round_trips, &done);
  done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  server.stop();
  char note[64];
  std::snprintf(note, sizeof note, "%.1f ns per round trip", ns_per(elapsed, round_trips));
  return {"ask_reply", 2 * round_trips, ns_per(elapsed, 2 * round_trips), note};
}

// --- 6. ask from a plain thread to an idle runtime --------------------------

// Alternates castmesh samples with samples of the machine's wake floor
// (WakeFloor), each after the same idle gap, and reports both: the floor
// moves between runs on a VM, the runtime's cost above it should not.
std::vector<WorkloadResult> idle_ask(const BenchOptions& options) {
  const int64_t samples = scaled(kIdleAskSamples, options);
  Runtime runtime(runtime_options(options));
  auto server = runtime.spawn<EchoServer>();
  WakeFloor floor;
  std::vector<double> samples_ns;
  std::vector<double> floor_ns;
  for (int64_t i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(kIdleAskGap);  // let every worker go idle
    const auto start = Clock::now();
    absl::StatusOr<int64_t> reply = server.ask(Echo{i}).get();
    const auto elapsed = Clock::now() - start;
    if (!reply.ok() || *reply != i) {
      std::fprintf(stderr, "idle ask failed: %s\n", reply.status().ToString().c_str());
      std::abort();
    }
    samples_ns.push_back(ns_per(elapsed, 1));
    std::this_thread::sleep_for(kIdleAskGap);
    floor_ns.push_back(floor.round_trip_ns());
  }
  return {summarize_latencies("idle_ask", std::move(samples_ns)),
          summarize_latencies("idle_wake_floor", std::move(floor_ns))};
}

}  // namespace
}  // namespace castmesh::bench

int main(int argc, char** argv) {
  using namespace castmesh::bench;
  const BenchOptions options = parse_bench_options(argc, argv, argv[0]);
  print_header("castmesh", options);
  struct Workload {
    const char* name;
    std::vector<WorkloadResult> (*run)(const BenchOptions&);
  };
  for (const Workload& w :
       {Workload{"ping_pong", [](const BenchOptions& o) { return std::vector{ping_pong(o)}; }},
        Workload{"fan_in_20to1", [](const BenchOptions& o) { return std::vector{fan_in(o)}; }},
        Workload{"spawn_stop", [](const BenchOptions& o) { return std::vector{spawn(o)}; }},
        Workload{"fork_join_64", [](const BenchOptions& o) { return std::vector{fork_join(o)}; }},
        Workload{"ask_reply", [](const BenchOptions& o) { return std::vector{ask_reply(o)}; }},
        Workload{"idle_ask", idle_ask}}) {
    if (!selected(w.name, options)) continue;
    for (const WorkloadResult& result : w.run(options)) print_result(result, options);
  }
  return 0;
}
