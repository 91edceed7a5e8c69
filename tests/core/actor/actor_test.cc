#include <gtest/gtest.h>

#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "test_actors.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;

TEST(Actor, TellThenAskSeesEveryTell) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto c = rt.spawn<Counter>(5);
  for (int i = 0; i < 100; ++i) c.tell(Add{1});
  auto v = c.ask(Get{}).get();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 105);
  static_assert(std::is_same_v<decltype(c.ask(Get{})), Future<int>>);
  static_assert(std::is_same_v<decltype(c.ask(Add{})), Future<Unit>>);
  static_assert(std::is_same_v<decltype(c.ask(Echo{})), Future<std::string>>);
}

struct Divide {
  int a, b;
};
struct Later {
  int v;
};
struct Check {
  int v;
};
class Calculator : public Actor {
 public:
  absl::StatusOr<int> divide(const Divide& d) {
    if (d.b == 0) return absl::InvalidArgumentError("division by zero");
    return d.a / d.b;
  }
  Future<int> later(const Later& l) { return make_ready_future(l.v * 2); }
  absl::Status check(const Check& c) { return c.v > 0 ? absl::OkStatus() : absl::OutOfRangeError("negative"); }
  using Handlers = castmesh::Handlers<&Calculator::divide, &Calculator::later, &Calculator::check>;
};

TEST(Actor, HandlerReturnFormsAnswerTheRequest) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto calc = rt.spawn<Calculator>();
  EXPECT_EQ(*calc.ask(Divide{10, 2}).get(), 5);
  auto err = calc.ask(Divide{1, 0}).get();
  EXPECT_EQ(err.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*calc.ask(Later{21}).get(), 42);
  EXPECT_TRUE(calc.ask(Check{1}).get().ok());
  EXPECT_EQ(calc.ask(Check{-1}).get().status().code(), absl::StatusCode::kOutOfRange);
  // A returned error is an answer, not a failure: the actor keeps running.
  EXPECT_EQ(*calc.ask(Divide{9, 3}).get(), 3);
}

struct Unknown {};

TEST(Actor, UnknownMessageIsAClearErrorAndActorKeepsRunning) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto c = rt.spawn<Counter>(1);
  UntypedRef any = c;
  auto r = any.ask<int>(Unknown{}).get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(r.status().message()).find(c.to_string()), std::string::npos) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("Unknown"), std::string::npos) << r.status();
  any.tell(Unknown{});  // logged and dropped
  any.tell(Add{2});     // untyped tell still dispatches through the handler table
  EXPECT_EQ(*c.ask(Get{}).get(), 3);
  // Wrong reply type on an untyped ask.
  auto wrong = any.ask<std::string>(Get{}).get();
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

TEST(Actor, AddressesPrintParseCompareAndHash) {
  Runtime rt(RuntimeOptions{.workers = 1});
  auto a = rt.spawn<Counter>();
  auto b = rt.spawn<Counter>();
  EXPECT_EQ(a.address().proc, "local");
  EXPECT_EQ(a.address().name, "Counter");
  EXPECT_NE(a, b);
  ActorRef<Counter> a2 = a;
  EXPECT_EQ(a, a2);
  absl::flat_hash_set<UntypedRef> set{a, b, a2};
  EXPECT_EQ(set.size(), 2u);
  const std::string text = a.to_string();
  EXPECT_EQ(text, "local/Counter[" + std::to_string(a.address().index) + "]");
  auto parsed = Address::parse(text);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, a.address());
  EXPECT_FALSE(Address::parse("nonsense").ok());
  EXPECT_FALSE(Address::parse("p/x[abc]").ok());
  auto with_slash = Address::parse("host:1/sub/name[3]");
  ASSERT_TRUE(with_slash.ok());
  EXPECT_EQ(with_slash->proc, "host:1/sub");
  auto port = PortAddress::parse(text + "#7");
  ASSERT_TRUE(port.ok());
  EXPECT_EQ(port->port, 7u);
  // A ref rebuilt from bytes resolves through the runtime at send time.
  auto back = ActorRef<Counter>::from_bytes(a.to_bytes());
  ASSERT_TRUE(back.ok());
  back->tell(Add{4});
  EXPECT_EQ(*a.ask(Get{}).get(), 4);
  EXPECT_EQ(*rt.resolve(a.address()).ask<int>(Get{}).get(), 4);
  // Nothing lives at this address: a clear error.
  auto none = ActorRef<Counter>::from_address(Address{"local", "nobody", 99}).ask(Get{}).get();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST(Actor, NamedSpawnAndIndexCollision) {
  Runtime rt(RuntimeOptions{.workers = 1});
  auto a = rt.spawn_with<Counter>(SpawnOptions{.name = "worker", .index = 3}, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->to_string(), "local/worker[3]");
  auto dup = rt.spawn_with<Counter>(SpawnOptions{.name = "worker", .index = 3}, 1);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  auto bad = rt.spawn_with<Counter>(SpawnOptions{.name = "a/b"}, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// Records (sender, seq) and checks each sender's sequence is increasing.
struct Seq {
  int sender;
  int seq;
};
struct Report {};
class OrderChecker : public Actor {
 public:
  void on(const Seq& s) {
    auto& last = last_[s.sender];
    if (s.seq != last + 1) ++violations_;
    last = s.seq;
    ++count_;
  }
  std::pair<int, int> report(const Report&) { return {count_, violations_}; }
  using Handlers = castmesh::Handlers<&OrderChecker::on, &OrderChecker::report>;

 private:
  std::map<int, int> last_;
  int count_ = 0;
  int violations_ = 0;
};

struct Blast {
  ActorRef<OrderChecker> to;
  int id;
  int n;
};
class Blaster : public Actor {
 public:
  void blast(const Blast& b) {
    for (int i = 1; i <= b.n; ++i) b.to.tell(Seq{b.id, i});
  }
  using Handlers = castmesh::Handlers<&Blaster::blast>;
};

TEST(Actor, MessagesFromOneSenderArriveInOrder) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto checker = rt.spawn<OrderChecker>();
  constexpr int kThreads = 4, kActors = 4, kPer = 5000;
  for (int a = 0; a < kActors; ++a) rt.spawn<Blaster>().tell(Blast{checker, 100 + a, kPer});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 1; i <= kPer; ++i) checker.tell(Seq{t, i});
    });
  }
  for (auto& t : threads) t.join();
  std::pair<int, int> r{0, 0};
  for (int tries = 0; tries < 2000 && r.first < (kThreads + kActors) * kPer; ++tries) {
    r = *checker.ask(Report{}).get();
    if (r.first < (kThreads + kActors) * kPer) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(r.first, (kThreads + kActors) * kPer);
  EXPECT_EQ(r.second, 0);
}

// Detects two threads inside one actor at once.
struct Enter {};
struct Overlaps {};
class Exclusive : public Actor {
 public:
  explicit Exclusive(std::atomic<int>* inside, std::atomic<int>* overlaps) : inside_(inside), overlaps_(overlaps) {}
  void enter(const Enter&) {
    if (inside_->fetch_add(1) != 0) overlaps_->fetch_add(1);
    for (int i = 0; i < 50; ++i) std::atomic_signal_fence(std::memory_order_seq_cst);
    std::this_thread::yield();
    inside_->fetch_sub(1);
    ++handled_;
  }
  int count(const Overlaps&) const { return handled_; }
  using Handlers = castmesh::Handlers<&Exclusive::enter, &Exclusive::count>;

 private:
  std::atomic<int>* inside_;
  std::atomic<int>* overlaps_;
  int handled_ = 0;  // plain int: TSan flags concurrent entry too
};

TEST(Actor, HandlesOneMessageAtATime) {
  Runtime rt(RuntimeOptions{.workers = 4, .batch = 3});
  std::atomic<int> inside{0}, overlaps{0};
  auto ex = rt.spawn<Exclusive>(&inside, &overlaps);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) ex.tell(Enter{});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*ex.ask(Overlaps{}).get(), 8000);
  EXPECT_EQ(overlaps.load(), 0);
}

struct Hooks {
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::atomic<int> destroyed{0};
};
class Hooked : public Actor {
 public:
  Hooked(Hooks* h, int start) : h_(h), v_(start) {}
  ~Hooked() override { h_->destroyed++; }
  void on_start() override { h_->started++; }
  void on_stop() override { h_->stopped++; }
  int get(const Get&) { return v_; }
  void add(const Add& a) { v_ += a.n; }
  using Handlers = castmesh::Handlers<&Hooked::get, &Hooked::add>;

 private:
  Hooks* h_;
  int v_;
};

TEST(Actor, LifecycleHooksAndStopDrainsEarlierMessages) {
  Hooks hooks;
  Runtime rt(RuntimeOptions{.workers = 2});
  auto a = rt.spawn<Hooked>(&hooks, 7);
  EXPECT_EQ(*a.ask(Get{}).get(), 7);
  EXPECT_EQ(hooks.started.load(), 1);
  auto before = a.ask(Add{1});
  a.stop();
  auto after = a.ask(Get{});
  EXPECT_TRUE(before.get().ok());  // sent before stop(): handled
  auto r = after.get();           // sent after stop(): fails, naming the actor
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(r.status().message()).find(a.to_string()), std::string::npos);
  EXPECT_EQ(a.ask(Get{}).get().status().code(), absl::StatusCode::kUnavailable);
  // `after` may be refused at send time, as soon as the mailbox closes, which
  // can be before the worker has run on_stop and the destructor: wait for them.
  for (int i = 0; i < 5000 && (rt.live_actors() != 0 || hooks.destroyed.load() == 0); ++i) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(hooks.stopped.load(), 1);
  EXPECT_EQ(hooks.destroyed.load(), 1);
  EXPECT_EQ(rt.live_actors(), 0u);
}

// A third actor answers a request through a OncePort handed to it.
struct Work {
  int x;
  OncePort<int> reply;
};
class Doubler : public Actor {
 public:
  void work(Work w) { w.reply.send(w.x * 2); }
  using Handlers = castmesh::Handlers<&Doubler::work>;
};
struct Compute {
  int x;
};
class Front : public Actor {
 public:
  explicit Front(ActorRef<Doubler> d) : d_(std::move(d)) {}
  Future<int> compute(const Compute& c) {
    auto [port, fut] = make_once_port<int>();
    d_.tell(Work{c.x, std::move(port)});
    return std::move(fut);
  }
  using Handlers = castmesh::Handlers<&Front::compute>;

 private:
  ActorRef<Doubler> d_;
};

TEST(Actor, OncePortHandedToAThirdActor) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto front = rt.spawn<Front>(rt.spawn<Doubler>());
  EXPECT_EQ(*front.ask(Compute{21}).get(), 42);
}

struct Sample {
  int v;
};
struct Sum {};
class Summer : public Actor {
 public:
  void sample(Sample s) { sum_ += s.v; }
  int sum(const Sum&) { return sum_; }
  using Handlers = castmesh::Handlers<&Summer::sample, &Summer::sum>;

 private:
  int sum_ = 0;
};

TEST(Actor, PortCarriesManyMessagesAndSerializes) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto s = rt.spawn<Summer>();
  Port<Sample> port = s.port<Sample>();
  for (int i = 1; i <= 10; ++i) port.send(Sample{i});
  auto copy = Port<Sample>::from_bytes(port.to_bytes());
  ASSERT_TRUE(copy.ok());
  copy->send(Sample{45});
  EXPECT_EQ(*s.ask(Sum{}).get(), 100);
}

// A dedicated-thread actor may block (here on another actor's answer).
struct Relay {
  ActorRef<Counter> to;
};
class Blocking : public Actor {
 public:
  int relay(const Relay& r) { return r.to.ask(Get{}).get().value_or(-1); }
  using Handlers = castmesh::Handlers<&Blocking::relay>;
};

TEST(Actor, DedicatedThreadActorMayBlock) {
  Runtime rt(RuntimeOptions{.workers = 1});
  auto c = rt.spawn<Counter>(11);
  auto b = rt.spawn_with<Blocking>(SpawnOptions{.dedicated_thread = true});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->ask(Relay{c}).get(), 11);
}

TEST(Actor, PooledActorBlockingHandsItsQueuedWorkToAnotherWorker) {
  // Discouraged, but must not deadlock while another worker is free: the
  // counter was queued on the blocking worker's next slot.
  Runtime rt(RuntimeOptions{.workers = 2});
  auto c = rt.spawn<Counter>(11);
  auto pooled = rt.spawn<Blocking>();
  EXPECT_EQ(*pooled.ask(Relay{c}).get(), 11);
}

struct Tick {};
struct Ticks {};
class Ticker : public Actor {
 public:
  void on_start() override {
    periodic_ = send_every(absl::Milliseconds(1), Tick{});
    send_after(absl::Milliseconds(2), Add{100});
  }
  void tick(const Tick&) {
    if (++ticks_ == 5) cancel_timer(periodic_);
  }
  void add(const Add& a) { added_ += a.n; }
  std::pair<int, int> get(const Ticks&) { return {ticks_, added_}; }
  using Handlers = castmesh::Handlers<&Ticker::tick, &Ticker::add, &Ticker::get>;

 private:
  TimerId periodic_ = 0;
  int ticks_ = 0;
  int added_ = 0;
};

TEST(Actor, TimersDeliverOnceAndPeriodically) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto t = rt.spawn<Ticker>();
  std::pair<int, int> r{0, 0};
  for (int i = 0; i < 5000 && (r.first < 5 || r.second < 100); ++i) {
    std::this_thread::sleep_for(1ms);
    r = *t.ask(Ticks{}).get();
  }
  EXPECT_EQ(r.second, 100);
  // A tick the timer thread already sent when the cancel ran may still
  // arrive; after that, no more.
  EXPECT_GE(r.first, 5);
  std::this_thread::sleep_for(20ms);
  const int settled = t.ask(Ticks{}).get()->first;
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(t.ask(Ticks{}).get()->first, settled);
  auto c = rt.spawn<Counter>();
  rt.send_after(absl::Milliseconds(1), c, Add{3});
  int v = 0;
  for (int i = 0; i < 5000 && v != 3; ++i) {
    std::this_thread::sleep_for(1ms);
    v = *c.ask(Get{}).get();
  }
  EXPECT_EQ(v, 3);
}

TEST(Actor, WorkerCountIsSettable) {
  Runtime rt(RuntimeOptions{.workers = 3});
  EXPECT_EQ(rt.worker_count(), 3);
  Runtime def;
  EXPECT_EQ(def.worker_count(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace castmesh::testing
