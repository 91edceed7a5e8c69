#include <castmesh/castmesh.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>

#include "../actor/test_actors.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;

TEST(Future, GetWithTimeoutThenValue) {
  auto [port, fut] = make_once_port<int>();
  auto r = fut.get(absl::Milliseconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(fut.valid());  // still waitable
  std::thread t([p = port] {
    std::this_thread::sleep_for(2ms);
    p.send(7);
  });
  EXPECT_EQ(*fut.get(5s), 7);
  EXPECT_FALSE(fut.valid());
  EXPECT_EQ(fut.get().status().code(), absl::StatusCode::kFailedPrecondition);
  t.join();
}

// A deadline that has passed, or passes at once, ends the wait with a
// timeout, and the future stays valid.
TEST(Future, DeadlineAlreadyPassedEndsTheWaitAndKeepsTheFuture) {
  auto [port, fut] = make_once_port<int>();
  EXPECT_EQ(fut.get(absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fut.get(absl::Nanoseconds(1)).status().code(), absl::StatusCode::kDeadlineExceeded);
  port.send(7);
  auto v = fut.get();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 7);
}

// A reply racing the waiter's deadline (before the waiter sleeps, as it
// sleeps, or as the deadline ends the sleep): the waiter gets the value or a timeout,
// never a hang or a lost value; a timed-out future still gets the value.
TEST(Future, ReplyRacingATimeoutIsEitherDeliveredOrTimedOut) {
  constexpr int kRounds = 2000;
  for (int i = 0; i < kRounds; ++i) {
    auto [port, fut] = make_once_port<int>();
    std::latch start(2);
    std::thread replier([&, p = std::move(port)]() mutable {
      start.arrive_and_wait();
      for (int k = 0; k < (i * 37) % 2000; ++k) std::atomic_signal_fence(std::memory_order_seq_cst);
      p.send(i);
    });
    start.arrive_and_wait();
    auto v = fut.get(absl::Microseconds(i % 120));
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
      v = fut.get();
    }
    replier.join();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, i);
  }
}

TEST(Future, FirstAnswerWinsAndDroppedPortFails) {
  auto [port, fut] = make_once_port<int>();
  port.send(1);
  port.send(2);
  EXPECT_EQ(*fut.get(), 1);
  Future<std::string> orphan;
  {
    auto [p2, f2] = make_once_port<std::string>();
    orphan = std::move(f2);
  }  // every copy of the port dropped without an answer
  EXPECT_EQ(orphan.get().status().code(), absl::StatusCode::kAborted);
}

TEST(Future, ThenChainsValuesFuturesAndPropagatesErrors) {
  auto f = make_ready_future(20).then([](int v) { return v + 1; }).then([](int v) {
    return make_ready_future(std::to_string(v * 2));
  });
  EXPECT_EQ(*f.get(), "42");

  bool ran = false;
  auto failed = make_failed_future<int>(absl::NotFoundError("gone")).then([&](int v) {
    ran = true;
    return v;
  });
  EXPECT_EQ(failed.get().status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(ran);

  auto status_step = make_ready_future(1).then([](int) { return absl::InternalError("step failed"); });
  EXPECT_EQ(status_step.get().status().code(), absl::StatusCode::kInternal);

  // A continuation attached before completion runs on the completing thread.
  auto [port, fut] = make_once_port<int>();
  std::atomic<int> seen{0};
  auto done = std::move(fut).then([&](int v) {
    seen = v;
    return Unit{};
  });
  EXPECT_FALSE(done.ready());
  port.send(9);
  EXPECT_TRUE(done.ready());
  EXPECT_EQ(seen.load(), 9);
}

TEST(Future, OnReadyGetsErrorsToo) {
  auto [port, fut] = make_once_port<int>();
  absl::Status got;
  std::move(fut).on_ready([&](absl::StatusOr<int> v) { got = v.status(); });
  port.fail(absl::UnavailableError("peer died"));
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
}

TEST(Future, WhenAllAndWhenAny) {
  Runtime rt(RuntimeOptions{.workers = 2});
  std::vector<ActorRef<Counter>> cs;
  std::vector<Future<int>> fs;
  for (int i = 0; i < 8; ++i) {
    cs.push_back(rt.spawn<Counter>(i));
    fs.push_back(cs.back().ask(Get{}));
  }
  auto all = when_all(std::move(fs)).get();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));

  std::vector<Future<int>> with_error;
  with_error.push_back(cs[0].ask(Get{}));
  with_error.push_back(make_failed_future<int>(absl::InternalError("x")));
  EXPECT_EQ(when_all(std::move(with_error)).get().status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(when_all(std::vector<Future<int>>{}).get()->empty());

  auto [never_port, never] = make_once_port<int>();
  std::vector<Future<int>> race;
  race.push_back(std::move(never));
  race.push_back(make_failed_future<int>(absl::InternalError("x")));
  race.push_back(cs[5].ask(Get{}));
  auto any = when_any(std::move(race)).get(5s);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->index, 2u);
  EXPECT_EQ(any->value, 5);

  std::vector<Future<int>> all_fail;
  all_fail.push_back(make_failed_future<int>(absl::InternalError("a")));
  all_fail.push_back(make_failed_future<int>(absl::NotFoundError("b")));
  EXPECT_FALSE(when_any(std::move(all_fail)).get().ok());
  EXPECT_EQ(when_any(std::vector<Future<int>>{}).get().status().code(), absl::StatusCode::kInvalidArgument);
}

// Blocks its dedicated thread until released, so requests queue up behind.
struct Hold {
  std::latch* entered;
  std::latch* release;
};
struct Bump {};
class Gate : public Actor {
 public:
  explicit Gate(std::atomic<int>* bumps) : bumps_(bumps) {}
  void hold(const Hold& h) {
    h.entered->count_down();
    h.release->wait();
  }
  int bump(const Bump&) { return ++*bumps_; }
  using Handlers = castmesh::Handlers<&Gate::hold, &Gate::bump>;

 private:
  std::atomic<int>* bumps_;
};

TEST(Future, CancelResolvesAtOnceAndSkipsTheQueuedRequest) {
  Runtime rt(RuntimeOptions{.workers = 1});
  std::atomic<int> bumps{0};
  auto gate = rt.spawn_with<Gate>(SpawnOptions{.dedicated_thread = true}, &bumps).value();
  std::latch entered(1), release(1);
  gate.tell(Hold{&entered, &release});
  entered.wait();
  auto cancelled = gate.ask(Bump{});
  auto kept = gate.ask(Bump{});
  cancelled.cancel();
  EXPECT_EQ(cancelled.get().status().code(), absl::StatusCode::kCancelled);
  release.count_down();
  EXPECT_EQ(*kept.get(), 1);  // the cancelled request never ran
  EXPECT_EQ(bumps.load(), 1);
}

// A handler returning a Future answers when that future completes; the
// continuation inside the actor (on_complete) runs one at a time with handlers.
struct Sum2 {
  ActorRef<Counter> a, b;
};
struct Total {};
class Aggregator : public Actor {
 public:
  Future<int> sum(const Sum2& s) {
    std::vector<Future<int>> fs;
    fs.push_back(s.a.ask(Get{}));
    fs.push_back(s.b.ask(Get{}));
    auto [port, out] = make_once_port<int>();
    on_complete(when_all(std::move(fs)), [this, port = port](absl::StatusOr<std::vector<int>> v) {
      if (!v.ok()) {
        port.fail(v.status());
        return;
      }
      total_ += (*v)[0] + (*v)[1];  // actor state: safe, runs inside the actor
      port.send((*v)[0] + (*v)[1]);
    });
    return std::move(out);
  }
  int total(const Total&) { return total_; }
  using Handlers = castmesh::Handlers<&Aggregator::sum, &Aggregator::total>;

 private:
  int total_ = 0;
};

TEST(Future, ActorsComposeFuturesWithoutBlocking) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto agg = rt.spawn<Aggregator>();
  auto a = rt.spawn<Counter>(40);
  auto b = rt.spawn<Counter>(2);
  std::vector<Future<int>> fs;
  for (int i = 0; i < 50; ++i) fs.push_back(agg.ask(Sum2{a, b}));
  for (auto& f : fs) EXPECT_EQ(*f.get(), 42);
  EXPECT_EQ(*agg.ask(Total{}).get(), 42 * 50);
}

TEST(Future, RequestToDeadActorFailsNamingIt) {
  Runtime rt(RuntimeOptions{.workers = 2});
  auto c = rt.spawn<Counter>();
  c.stop();
  auto r = c.ask(Get{}).get(5s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(r.status().message()).find(c.to_string()), std::string::npos);
}

}  // namespace
}  // namespace castmesh::testing
