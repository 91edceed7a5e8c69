// The issue 3 actor workloads against CAF 0.17 (the comparison target).
// Written the idiomatic CAF way: event-based actors, replies by returning a
// value from the handler, request(...).then(...) for ask, scoped_actor for the
// plain-thread request. See actor_workloads.h for the sizes.
#include <caf/all.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "actor_workloads.h"

namespace castmesh::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One fresh actor system per workload, so nothing carries over between them.
struct CafSystem {
  explicit CafSystem(const BenchOptions& options) : system(configure(config, options)) {}
  static caf::actor_system_config& configure(caf::actor_system_config& config,
                                             const BenchOptions& options) {
    if (options.threads > 0) config.set("scheduler.max-threads", static_cast<size_t>(options.threads));
    return config;
  }
  caf::actor_system_config config;
  caf::actor_system system;
};

// --- 1. ping-pong -----------------------------------------------------------

caf::behavior ponger(caf::event_based_actor*) {
  return {[](int64_t n) { return n; }};  // the reply goes back to the sender
}

caf::behavior pinger(caf::event_based_actor* self, caf::actor peer, int64_t round_trips,
                     std::promise<void>* done) {
  self->send(peer, int64_t{0});
  return {[=](int64_t n) {
    if (n + 1 == round_trips) {
      done->set_value();
      self->quit();
      return;
    }
    self->send(peer, n + 1);
  }};
}

WorkloadResult ping_pong(const BenchOptions& options) {
  const int64_t round_trips = scaled(kPingPongRoundTrips, options);
  CafSystem caf{options};
  std::promise<void> done;
  const auto start = Clock::now();
  auto peer = caf.system.spawn(ponger);
  caf.system.spawn(pinger, peer, round_trips, &done);
  done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  caf::anon_send_exit(peer, caf::exit_reason::user_shutdown);
  char note[64];
  std::snprintf(note, sizeof note, "%.1f ns per round trip", ns_per(elapsed, round_trips));
  return {"ping_pong", 2 * round_trips, ns_per(elapsed, 2 * round_trips), note};
}

// --- 2. N:1 mailbox ---------------------------------------------------------

caf::behavior fan_in_receiver(caf::event_based_actor* self, int64_t expected,
                              std::promise<void>* done) {
  auto received = std::make_shared<int64_t>(0);
  return {[=](int64_t) {
    if (++*received == expected) {
      done->set_value();
      self->quit();
    }
  }};
}

void fan_in_sender(caf::event_based_actor* self, caf::actor receiver, int64_t messages) {
  for (int64_t i = 0; i < messages; ++i) self->send(receiver, i);
}

WorkloadResult fan_in(const BenchOptions& options) {
  const int64_t per_sender = scaled(kFanInMessagesPerSender, options);
  const int64_t total = kFanInSenders * per_sender;
  CafSystem caf{options};
  std::promise<void> done;
  const auto start = Clock::now();
  auto receiver = caf.system.spawn(fan_in_receiver, total, &done);
  for (int64_t s = 0; s < kFanInSenders; ++s) caf.system.spawn(fan_in_sender, receiver, per_sender);
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

// Spawned from the main thread (CAF 0.17 degrades quadratically when one actor
// spawns them all: its workers steal from a long local deque in O(n)). A child
// does nothing and terminates right after it starts; its stop is
// counted by a functor CAF runs at termination.
void spawned_child(caf::event_based_actor* self, SpawnCount* count) {
  self->attach_functor([count] {
    if (count->stopped.fetch_add(1, std::memory_order_acq_rel) + 1 == count->expected)
      count->done.set_value();
  });
}

WorkloadResult spawn(const BenchOptions& options) {
  CafSystem caf{options};
  SpawnCount count;
  count.expected = scaled(kSpawnActors, options);
  const auto start = Clock::now();
  for (int64_t i = 0; i < count.expected; ++i) caf.system.spawn(spawned_child, &count);
  count.done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  return {"spawn_stop", count.expected, ns_per(elapsed, count.expected), "per actor"};
}

// --- 4. fork-join throughput (Savina) ---------------------------------------

struct JoinCount {
  std::atomic<int64_t> workers_left{0};
  std::promise<void> done;
};

caf::behavior fork_join_worker(caf::event_based_actor* self, int64_t expected, JoinCount* join) {
  auto received = std::make_shared<int64_t>(0);
  return {[=](int64_t message) {
    fork_join_work(message);
    if (++*received == expected) {
      if (join->workers_left.fetch_sub(1, std::memory_order_acq_rel) == 1) join->done.set_value();
      self->quit();
    }
  }};
}

void fork_join_sender(caf::event_based_actor* self, std::vector<caf::actor> workers,
                      int64_t per_worker) {
  for (int64_t m = 0; m < per_worker; ++m)
    for (auto& worker : workers) self->send(worker, m);
}

WorkloadResult fork_join(const BenchOptions& options) {
  const int64_t per_worker = scaled(kForkJoinMessagesPerWorker, options);
  CafSystem caf{options};
  JoinCount join;
  join.workers_left = kForkJoinWorkers;
  const auto start = Clock::now();
  std::vector<caf::actor> workers;
  for (int64_t w = 0; w < kForkJoinWorkers; ++w)
    workers.push_back(caf.system.spawn(fork_join_worker, per_worker, &join));
  caf.system.spawn(fork_join_sender, std::move(workers), per_worker);
  join.done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  const int64_t total = kForkJoinWorkers * per_worker;
  return {"fork_join_64", total, ns_per(elapsed, total), ""};
}

// --- 5. ask/reply between actors --------------------------------------------

caf::behavior echo_server(caf::event_based_actor*) {
  return {[](int64_t n) { return n; }};
}

void ask_next(caf::event_based_actor* self, caf::actor server, int64_t n, int64_t round_trips,
              std::promise<void>* done) {
  self->request(server, caf::infinite, n).then([=](int64_t reply) {
    if (reply + 1 == round_trips) {
      done->set_value();
      self->quit();
      return;
    }
    ask_next(self, server, reply + 1, round_trips, done);
  });
}

caf::behavior ask_client(caf::event_based_actor* self, caf::actor server, int64_t round_trips,
                         std::promise<void>* done) {
  ask_next(self, server, 0, round_trips, done);
  return {[](int64_t) {}};  // keeps the actor alive between replies
}

WorkloadResult ask_reply(const BenchOptions& options) {
  const int64_t round_trips = scaled(kAskRoundTrips, options);
  CafSystem caf{options};
  std::promise<void> done;
  const auto start = Clock::now();
  auto server = caf.system.spawn(echo_server);
  caf.system.spawn(ask_client, server, round_trips, &done);
  done.get_future().wait();
  const auto elapsed = Clock::now() - start;
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
  char note[64];
  std::snprintf(note, sizeof note, "%.1f ns per round trip", ns_per(elapsed, round_trips));
  return {"ask_reply", 2 * round_trips, ns_per(elapsed, 2 * round_trips), note};
}

// --- 6. request from a plain thread to an idle runtime ----------------------

WorkloadResult idle_ask(const BenchOptions& options) {
  const int64_t samples = scaled(kIdleAskSamples, options);
  CafSystem caf{options};
  auto server = caf.system.spawn(echo_server);
  caf::scoped_actor self{caf.system};
  std::vector<double> samples_ns;
  for (int64_t i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(kIdleAskGap);  // let every worker go idle
    const auto start = Clock::now();
    int64_t reply = -1;
    self->request(server, caf::infinite, i)
        .receive([&](int64_t r) { reply = r; },
                 [&](caf::error& e) { std::fprintf(stderr, "idle ask failed: %s\n",
                                                   caf.system.render(e).c_str()); });
    const auto elapsed = Clock::now() - start;
    if (reply != i) std::abort();
    samples_ns.push_back(ns_per(elapsed, 1));
  }
  self->send_exit(server, caf::exit_reason::user_shutdown);
  return summarize_latencies("idle_ask", std::move(samples_ns));
}

}  // namespace
}  // namespace castmesh::bench

int main(int argc, char** argv) {
  using namespace castmesh::bench;
  const BenchOptions options = parse_bench_options(argc, argv, argv[0]);
  print_header("CAF " + std::to_string(CAF_MAJOR_VERSION) + "." + std::to_string(CAF_MINOR_VERSION) + "." +
                   std::to_string(CAF_PATCH_VERSION),
               options);
  struct Workload {
    const char* name;
    WorkloadResult (*run)(const BenchOptions&);
  };
  for (const Workload& w : {Workload{"ping_pong", ping_pong}, Workload{"fan_in_20to1", fan_in},
                            Workload{"spawn_stop", spawn}, Workload{"fork_join_64", fork_join},
                            Workload{"ask_reply", ask_reply}, Workload{"idle_ask", idle_ask}}) {
    if (selected(w.name, options)) print_result(w.run(options), options);
  }
  return 0;
}
