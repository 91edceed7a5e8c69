#include <castmesh/castmesh.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "../actor/test_actors.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;

// Collects what reaches the root of the supervision tree.
struct RootLog {
  std::mutex mu;
  std::vector<SupervisionEvent> events;
  void add(const SupervisionEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return events.size();
  }
  SupervisionEvent at(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return events.at(i);
  }
  bool wait_for(size_t n) {
    for (int i = 0; i < 5000 && size() < n; ++i) std::this_thread::sleep_for(1ms);
    return size() >= n;
  }
};

RuntimeOptions with_root(RootLog* log) {
  RuntimeOptions o;
  o.workers = 2;
  o.on_unhandled_failure = [log](const SupervisionEvent& e) { log->add(e); };
  return o;
}

TEST(Supervision, ThrowingHandlerStopsActorAndReportsToRoot) {
  RootLog root;
  Runtime rt(with_root(&root));
  auto c = rt.spawn<Counter>();
  auto queued_before = c.ask(Get{});
  auto in_flight = c.ask(Fail{"boom"});
  auto queued_after = c.ask(Get{});
  EXPECT_TRUE(queued_before.get().ok());
  auto r = in_flight.get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(std::string(r.status().message()).find("boom"), std::string::npos);
  EXPECT_NE(std::string(r.status().message()).find(c.to_string()), std::string::npos);
  auto after = queued_after.get();
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(after.status().message()).find("boom"), std::string::npos);
  ASSERT_TRUE(root.wait_for(1));
  const auto ev = root.at(0);
  EXPECT_EQ(ev.child, c.address());
  EXPECT_EQ(ev.origin, c.address());
  EXPECT_NE(ev.message_type.find("Fail"), std::string::npos);
  EXPECT_NE(std::string(ev.reason.message()).find("boom"), std::string::npos);
  EXPECT_EQ(c.ask(Get{}).get().status().code(), absl::StatusCode::kUnavailable);
}

struct SpawnChild {};
struct ChildFailures {};
class Supervisor : public Actor {
 public:
  explicit Supervisor(bool handle) : handle_(handle) {}
  ActorRef<Counter> spawn_child(const SpawnChild&) { return spawn<Counter>(); }
  bool on_child_failed(const SupervisionEvent& e) override {
    seen_.push_back(e);
    return handle_;
  }
  std::vector<SupervisionEvent> failures(const ChildFailures&) { return seen_; }
  using Handlers = castmesh::Handlers<&Supervisor::spawn_child, &Supervisor::failures>;

 private:
  bool handle_;
  std::vector<SupervisionEvent> seen_;
};

TEST(Supervision, ParentThatHandlesTheEventKeepsRunning) {
  RootLog root;
  Runtime rt(with_root(&root));
  auto sup = rt.spawn<Supervisor>(true);
  auto child = sup.ask(SpawnChild{}).get().value();
  EXPECT_FALSE(child.ask(Fail{"child broke"}).get().ok());
  std::vector<SupervisionEvent> seen;
  for (int i = 0; i < 5000 && seen.empty(); ++i) {
    seen = sup.ask(ChildFailures{}).get().value();
    if (seen.empty()) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].child, child.address());
  EXPECT_NE(seen[0].message_type.find("Fail"), std::string::npos);
  EXPECT_TRUE(sup.ask(ChildFailures{}).get().ok());  // parent alive
  EXPECT_EQ(root.size(), 0u);
}

// Middle spawns a Counter; neither Middle nor Top handle failures, so a
// failing grandchild stops Middle and Top and reaches the root.
struct Build {};
class Middle : public Actor {
 public:
  ActorRef<Counter> build(const Build&) { return spawn<Counter>(); }
  using Handlers = castmesh::Handlers<&Middle::build>;
};
class Top : public Actor {
 public:
  Future<ActorRef<Counter>> build(const Build&) {
    middle_ = spawn<Middle>();
    return middle_.ask(Build{});
  }
  ActorRef<Middle> middle(const Get&) { return middle_; }
  using Handlers = castmesh::Handlers<&Top::build, &Top::middle>;

 private:
  ActorRef<Middle> middle_;
};

TEST(Supervision, UnhandledFailureEscalatesToTheRoot) {
  RootLog root;
  Runtime rt(with_root(&root));
  auto top = rt.spawn<Top>();
  auto leaf = top.ask(Build{}).get().value();
  auto middle = top.ask(Get{}).get().value();
  std::vector<DownEvent> downs;
  std::mutex mu;
  rt.monitor(top, [&](const DownEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    downs.push_back(e);
  });
  leaf.tell(Fail{"deep"});
  ASSERT_TRUE(root.wait_for(1));
  const auto ev = root.at(0);
  EXPECT_EQ(ev.child, top.address());
  EXPECT_EQ(ev.origin, leaf.address());
  EXPECT_NE(ev.to_string().find("deep"), std::string::npos) << ev.to_string();
  EXPECT_NE(ev.to_string().find(middle.to_string()), std::string::npos) << ev.to_string();
  EXPECT_EQ(middle.ask(Build{}).get().status().code(), absl::StatusCode::kUnavailable);
  for (int i = 0; i < 5000; ++i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!downs.empty()) break;
    mu.unlock();
    std::this_thread::sleep_for(1ms);
    mu.lock();
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(downs.size(), 1u);
  EXPECT_FALSE(downs[0].reason.ok());
  EXPECT_EQ(root.size(), 1u);
}

struct Watch {
  UntypedRef target;
};
struct Downs {};
struct Unwatch {
  UntypedRef target;
  MonitorId id = 0;
};
class Watcher : public Actor {
 public:
  MonitorId watch(const Watch& w) { return monitor(w.target); }
  bool unwatch(const Unwatch& u) { return demonitor(u.target, u.id); }
  void on_down(const DownEvent& e) override { downs_.push_back(e); }
  std::vector<DownEvent> downs(const Downs&) { return downs_; }
  using Handlers = castmesh::Handlers<&Watcher::watch, &Watcher::unwatch, &Watcher::downs>;

 private:
  std::vector<DownEvent> downs_;
};

TEST(Supervision, MonitorSeesNormalStopFailureAndAlreadyDead) {
  RootLog root;
  Runtime rt(with_root(&root));
  auto w = rt.spawn<Watcher>();
  auto a = rt.spawn<Counter>();
  auto b = rt.spawn<Counter>();
  auto dead = rt.spawn<Counter>();
  dead.stop();
  EXPECT_FALSE(dead.ask(Get{}).get().ok());
  EXPECT_TRUE(w.ask(Watch{a}).get().ok());
  EXPECT_TRUE(w.ask(Watch{b}).get().ok());
  EXPECT_TRUE(w.ask(Watch{dead}).get().ok());
  a.stop();
  b.tell(Fail{"b failed"});
  std::vector<DownEvent> downs;
  for (int i = 0; i < 5000 && downs.size() < 3; ++i) {
    downs = w.ask(Downs{}).get().value();
    if (downs.size() < 3) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(downs.size(), 3u);
  int normal = 0, failed = 0;
  for (const auto& d : downs) {
    if (d.actor == b.address()) {
      EXPECT_NE(std::string(d.reason.message()).find("b failed"), std::string::npos);
      ++failed;
    } else {
      EXPECT_TRUE(d.actor == a.address() || d.actor == dead.address());
      ++normal;
    }
  }
  EXPECT_EQ(normal, 2);
  EXPECT_EQ(failed, 1);
  EXPECT_TRUE(root.wait_for(1));  // b had the root as parent
}

TEST(Supervision, DemonitoredActorIsNotToldAndOtherMonitorsAre) {
  Runtime rt;
  auto w = rt.spawn<Watcher>();
  auto a = rt.spawn<Counter>();
  auto b = rt.spawn<Counter>();
  const MonitorId on_a = w.ask(Watch{a}).get().value();
  const MonitorId on_b = w.ask(Watch{b}).get().value();
  EXPECT_NE(on_a, on_b);
  EXPECT_TRUE(w.ask(Unwatch{a, on_a}).get().value());
  EXPECT_FALSE(w.ask(Unwatch{a, on_a}).get().value());  // already gone
  // Watchers are told in the order they were added: once this later one
  // ran, w would have been told too, had it still been watching.
  std::atomic<bool> a_down{false};
  rt.monitor(a, [&](const DownEvent&) { a_down = true; });
  a.stop();
  for (int i = 0; i < 5000 && !a_down; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(a_down);
  b.stop();
  std::vector<DownEvent> downs;
  for (int i = 0; i < 5000 && downs.empty(); ++i) {
    downs = w.ask(Downs{}).get().value();
    if (downs.empty()) std::this_thread::sleep_for(1ms);
  }
  // The watcher's mailbox is FIFO: a down from a would have come first.
  ASSERT_EQ(downs.size(), 1u);
  EXPECT_EQ(downs[0].actor, b.address());
  EXPECT_FALSE(w.ask(Unwatch{b, on_b}).get().value());  // b was reported already
}

TEST(Supervision, DemonitorOfACallbackMonitor) {
  Runtime rt;
  auto a = rt.spawn<Counter>();
  std::atomic<int> removed_calls{0}, kept_calls{0};
  const MonitorId removed = rt.monitor(a, [&](const DownEvent&) { ++removed_calls; });
  const MonitorId kept = rt.monitor(a, [&](const DownEvent&) { ++kept_calls; });
  EXPECT_FALSE(rt.demonitor(a, kept + 1000));  // not a monitor of a
  EXPECT_FALSE(rt.demonitor(UntypedRef(), removed));
  EXPECT_TRUE(rt.demonitor(a, removed));
  a.stop();
  // Told in the order added: once `kept` ran, `removed` would have too.
  for (int i = 0; i < 5000 && kept_calls == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(kept_calls.load(), 1);
  EXPECT_EQ(removed_calls.load(), 0);
  EXPECT_FALSE(rt.demonitor(a, kept));
}

struct Boom {};
class FailsOnStart : public Actor {
 public:
  void on_start() override { throw std::runtime_error("cannot start"); }
  int get(const Get&) { return 1; }
  using Handlers = castmesh::Handlers<&FailsOnStart::get>;
};

TEST(Supervision, OnStartFailureFailsTheActor) {
  RootLog root;
  Runtime rt(with_root(&root));
  auto a = rt.spawn<FailsOnStart>();
  auto r = a.ask(Get{}).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(r.status().message()).find("cannot start"), std::string::npos);
  ASSERT_TRUE(root.wait_for(1));
  EXPECT_NE(root.at(0).to_string().find("on_start"), std::string::npos);
}

TEST(Supervision, StoppingAParentStopsItsChildren) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto sup = rt.spawn<Supervisor>(true);
  auto child = sup.ask(SpawnChild{}).get().value();
  sup.stop();
  absl::Status st;
  for (int i = 0; i < 5000; ++i) {
    st = child.ask(Get{}).get().status();
    if (!st.ok()) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  for (int i = 0; i < 5000 && rt.live_actors() != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(rt.live_actors(), 0u);
}

}  // namespace
}  // namespace castmesh::testing
