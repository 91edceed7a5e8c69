#include <castmesh/castmesh.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "../actor/test_actors.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;

// An actor that keeps itself busy forever by re-sending to itself.
struct Spin {};
class SelfLoop : public Actor {
 public:
  explicit SelfLoop(std::atomic<long>* spins) : spins_(spins) {}
  void spin(const Spin&) {
    spins_->fetch_add(1, std::memory_order_relaxed);
    self_as<SelfLoop>().tell(Spin{});
  }
  using Handlers = castmesh::Handlers<&SelfLoop::spin>;

 private:
  std::atomic<long>* spins_;
};

TEST(Scheduler, BusyActorCannotStarveOthersOnOneWorker) {
  Runtime rt(RuntimeOptions{.workers = 1, .batch = 8});
  std::atomic<long> spins{0};
  auto loop = rt.spawn<SelfLoop>(&spins);
  for (int i = 0; i < 4; ++i) loop.tell(Spin{});
  auto c = rt.spawn<Counter>(3);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(*c.ask(Get{}).get(10s), 3);
  for (int i = 0; i < 20; ++i) c.tell(Add{1});
  EXPECT_EQ(*c.ask(Get{}).get(10s), 23);
  EXPECT_GT(spins.load(), 0);
}

TEST(Scheduler, AskFromPlainThreadWakesAnIdleRuntime) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto c = rt.spawn<Counter>(1);
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(200us);  // let the workers park
    ASSERT_EQ(*c.ask(Get{}).get(10s), 1);
  }
}

// Forwards a token around a ring of actors; counts hops, random delays.
struct Token {
  int hops_left;
};
struct SetNext {
  UntypedRef next;
};
struct Hops {};
class RingNode : public Actor {
 public:
  explicit RingNode(std::atomic<long>* total, unsigned seed) : total_(total), rng_(seed) {}
  void set_next(SetNext n) { next_ = std::move(n.next); }
  void token(Token t) {
    ++hops_;
    total_->fetch_add(1, std::memory_order_relaxed);
    if (rng_() % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 50));
    if (rng_() % 8 == 0) std::this_thread::yield();
    if (t.hops_left > 0) next_.tell(Token{t.hops_left - 1});
  }
  long hops(const Hops&) { return hops_; }
  using Handlers = castmesh::Handlers<&RingNode::set_next, &RingNode::token, &RingNode::hops>;

 private:
  std::atomic<long>* total_;
  std::minstd_rand rng_;
  UntypedRef next_;
  long hops_ = 0;
};

TEST(Scheduler, StressManyActorsManyMessagesRandomDelays) {
  Runtime rt(RuntimeOptions{.workers = 4, .batch = 16});
  constexpr int kNodes = 200, kTokens = 300, kHops = 100;
  std::atomic<long> total{0};
  std::vector<ActorRef<RingNode>> nodes;
  for (int i = 0; i < kNodes; ++i) nodes.push_back(rt.spawn<RingNode>(&total, 1234u + i));
  for (int i = 0; i < kNodes; ++i) nodes[i].tell(SetNext{nodes[(i + 1) % kNodes]});
  // Tokens injected from several plain threads at random nodes.
  std::vector<std::thread> injectors;
  for (int t = 0; t < 3; ++t) {
    injectors.emplace_back([&, t] {
      std::minstd_rand rng(77 + t);
      for (int k = 0; k < kTokens / 3; ++k) {
        nodes[rng() % kNodes].tell(Token{kHops - 1});
        if (rng() % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
      }
    });
  }
  for (auto& t : injectors) t.join();
  const long expected = static_cast<long>(kTokens) * kHops;
  for (int i = 0; i < 60000 && total.load() < expected; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(total.load(), expected);
  std::vector<Future<long>> counts;
  for (auto& n : nodes) counts.push_back(n.ask(Hops{}));
  auto all = when_all(std::move(counts)).get(30s);
  ASSERT_TRUE(all.ok()) << all.status();
  long sum = 0;
  for (long v : *all) sum += v;
  EXPECT_EQ(sum, expected);
}

// Shutdown while actors flood each other and plain threads keep asking.
struct Flood {
  UntypedRef peer;
};
class Flooder : public Actor {
 public:
  void flood(Flood f) {
    for (int i = 0; i < 4; ++i) f.peer.tell(Flood{self()});
  }
  int get(const Get&) { return 1; }
  using Handlers = castmesh::Handlers<&Flooder::flood, &Flooder::get>;
};

TEST(Scheduler, ShutdownUnderLoadJoinsAndFailsPendingRequests) {
  std::vector<Future<int>> pending;
  std::atomic<bool> stop_asking{false};
  std::vector<Future<int>> asked_during;
  std::mutex asked_mu;
  std::thread asker;
  {
    Runtime rt(RuntimeOptions{.workers = 3});
    std::vector<ActorRef<Flooder>> fs;
    for (int i = 0; i < 16; ++i) fs.push_back(rt.spawn<Flooder>());
    for (int i = 0; i < 16; ++i) fs[i].tell(Flood{fs[(i + 1) % 16]});
    auto dedicated = rt.spawn_with<Flooder>(SpawnOptions{.dedicated_thread = true}).value();
    dedicated.tell(Flood{fs[0]});
    for (int i = 0; i < 16; ++i) pending.push_back(fs[i].ask(Get{}));
    asker = std::thread([&, fs] {
      while (!stop_asking.load()) {
        auto f = fs[3].ask(Get{});
        std::lock_guard<std::mutex> lock(asked_mu);
        asked_during.push_back(std::move(f));
      }
    });
    std::this_thread::sleep_for(20ms);
    rt.shutdown();
    EXPECT_EQ(rt.live_actors(), 0u);
    stop_asking = true;
    asker.join();
    // Sends after shutdown fail at once.
    EXPECT_EQ(fs[0].ask(Get{}).get(1s).status().code(), absl::StatusCode::kUnavailable);
    auto late = rt.spawn<Counter>();
    EXPECT_EQ(late.ask(Get{}).get(1s).status().code(), absl::StatusCode::kUnavailable);
  }
  // Every request resolved (answered before shutdown or failed by it).
  for (auto& f : pending) {
    auto r = f.get(5s);
    EXPECT_NE(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  for (auto& f : asked_during) {
    auto r = f.get(5s);
    EXPECT_NE(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
}

TEST(Scheduler, ManySpawnsAndStops) {
  Runtime rt(RuntimeOptions{.workers = 2});
  for (int round = 0; round < 20; ++round) {
    std::vector<ActorRef<Counter>> cs;
    for (int i = 0; i < 200; ++i) cs.push_back(rt.spawn<Counter>(i));
    for (auto& c : cs) c.stop();
  }
  for (int i = 0; i < 10000 && rt.live_actors() != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(rt.live_actors(), 0u);
}

}  // namespace
}  // namespace castmesh::testing
