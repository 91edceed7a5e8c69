// Actors with short handlers (castmesh/actor.h, kShortHandlers): a message
// from another proc that finds such an actor idle runs on the delivering
// (transport) thread. Two runtimes in one process play two procs; the test
// thread plays the transport thread that delivers (may_run_here).
#include <castmesh/castmesh.h>
#include <castmesh/detail/runtime_transport.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/testing/test_messages.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;
using Seam = detail::RuntimeTransportSeam;

struct Note {
  int64_t n = 0;
};
struct Hold {};   // spins until released_ (a handler that is still running)
struct Crash {};  // throws
absl::Status encode_note(const Note& m, std::string* out) { return encode_decimal(m.n, out); }
absl::Status decode_note(std::string_view b, Note* m) { return decode_decimal(b, &m->n); }
CASTMESH_REGISTER_MESSAGE(Note, "test.ShortNote", encode_note, decode_note);
CASTMESH_REGISTER_MESSAGE(Hold, "test.ShortHold", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(Crash, "test.ShortCrash", encode_empty, decode_empty);

// What the actors saw, by note: the thread that handled it, in order.
struct Seen {
  std::mutex mu;
  std::vector<std::pair<int64_t, std::thread::id>> notes;
  std::thread::id stopped_on;
  std::atomic<bool> holding{false};
  std::atomic<bool> release{false};

  std::vector<std::pair<int64_t, std::thread::id>> snapshot() {
    std::lock_guard lock(mu);
    return notes;
  }
  // Waits until `n` notes were handled.
  bool wait_for(size_t n) {
    for (int i = 0; i < 2000; ++i) {
      if (snapshot().size() >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};
Seen& seen() {
  static Seen s;
  return s;
}

// Records every note; its class promises short handlers. Hold spins (the
// actor is busy meanwhile) without blocking.
class Quick : public Actor {
 public:
  static constexpr bool kShortHandlers = true;
  int64_t note(const Note& m) {
    std::lock_guard lock(seen().mu);
    seen().notes.emplace_back(m.n, std::this_thread::get_id());
    return m.n;
  }
  int64_t hold(const Hold&) {
    seen().holding = true;
    while (!seen().release.load()) std::this_thread::yield();
    return 0;
  }
  int64_t crash(const Crash&) { throw std::runtime_error("crash on purpose"); }
  void on_stop() override {
    std::lock_guard lock(seen().mu);
    seen().stopped_on = std::this_thread::get_id();
  }
  using Handlers = castmesh::Handlers<&Quick::note, &Quick::hold, &Quick::crash>;
};

// The same without the promise.
class Plain : public Actor {
 public:
  int64_t note(const Note& m) {
    std::lock_guard lock(seen().mu);
    seen().notes.emplace_back(m.n, std::this_thread::get_id());
    return m.n;
  }
  using Handlers = castmesh::Handlers<&Plain::note>;
};

// Carries requests as a transport's I/O thread would (may_run_here, on the
// sending thread) and answers as bytes too.
class DeliverHereRouter : public detail::RemoteRouter {
 public:
  void add(Runtime* rt) {
    std::lock_guard lock(mu_);
    procs_[rt->proc_id()] = rt;
  }
  void route(detail::WireMessage msg) override {
    Runtime* target = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = procs_.find(msg.destination.proc);
      if (it != procs_.end()) target = it->second;
    }
    if (target == nullptr) return;
    if (msg.port != 0) {
      (void)Seam::deliver_wire(*target, std::move(msg));
      return;
    }
    (void)Seam::deliver_serialized(*target, msg.destination, msg.type_name, msg.payload, msg.reply_to, msg.sender,
                                   /*may_run_here=*/true);
  }

 private:
  std::mutex mu_;
  std::map<ProcId, Runtime*> procs_;
};

class ShortHandlers : public ::testing::Test {
 protected:
  void SetUp() override {
    {
      std::lock_guard lock(seen().mu);
      seen().notes.clear();
      seen().stopped_on = {};
    }
    seen().holding = false;
    seen().release = false;
    router_ = std::make_shared<DeliverHereRouter>();
    a_ = std::make_unique<Runtime>(RuntimeOptions{.workers = 2, .proc_id = "proc-a"});
    b_ = std::make_unique<Runtime>(RuntimeOptions{.workers = 2, .proc_id = "proc-b"});
    router_->add(a_.get());
    router_->add(b_.get());
    Seam::set_remote_router(*a_, router_);
    Seam::set_remote_router(*b_, router_);
  }
  void TearDown() override {
    seen().release = true;
    b_.reset();
    a_.reset();
  }
  // Delivers Note{n} to `actor` as the transport would.
  void deliver_note(const Address& actor, int64_t n, bool may_run_here) {
    std::string bytes;
    ASSERT_TRUE(encode_note(Note{n}, &bytes).ok());
    ASSERT_TRUE(Seam::deliver_serialized(*b_, actor, "test.ShortNote", bytes, std::nullopt, {}, may_run_here).ok());
  }
  // Delivers notes from `first` on until one runs on this thread (the actor
  // was idle: its worker let go of it); returns the next number, or -1.
  int64_t deliver_until_here(const Address& actor, int64_t first) {
    for (int64_t n = first; n < first + 500; ++n) {
      deliver_note(actor, n, true);
      if (seen().wait_for(static_cast<size_t>(n)) && seen().snapshot().back().second == std::this_thread::get_id()) {
        return n + 1;
      }
      std::this_thread::sleep_for(2ms);
    }
    return -1;
  }
  std::shared_ptr<DeliverHereRouter> router_;
  std::unique_ptr<Runtime> a_, b_;
};

TEST_F(ShortHandlers, AnIdleActorRunsOnTheDeliveringThreadOnlyWhenAllowed) {
  auto quick = b_->spawn<Quick>();
  // Not allowed: always a worker.
  for (int64_t n = 1; n <= 20; ++n) deliver_note(quick.address(), n, false);
  ASSERT_TRUE(seen().wait_for(20));
  for (const auto& [n, thread] : seen().snapshot()) EXPECT_NE(thread, std::this_thread::get_id()) << n;
  // Allowed: once the actor is idle, the note runs here, before deliver returns.
  const int64_t next = deliver_until_here(quick.address(), 21);
  ASSERT_GT(next, 0) << "an idle short-handler actor never ran on the delivering thread";
  // In order throughout.
  const auto notes = seen().snapshot();
  for (size_t i = 0; i < notes.size(); ++i) EXPECT_EQ(notes[i].first, static_cast<int64_t>(i + 1));
}

TEST_F(ShortHandlers, ActorsWithoutThePromiseRunOnWorkers) {
  auto plain = b_->spawn<Plain>();
  for (int64_t n = 1; n <= 50; ++n) {
    deliver_note(plain.address(), n, true);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(seen().wait_for(50));
  for (const auto& [n, thread] : seen().snapshot()) EXPECT_NE(thread, std::this_thread::get_id()) << n;
}

TEST_F(ShortHandlers, ABusyActorQueuesAndKeepsTheOrder) {
  auto quick = b_->spawn<Quick>();
  quick.tell(Hold{});
  while (!seen().holding.load()) std::this_thread::yield();
  // Busy: each delivery queues (and returns at once), none runs here.
  for (int64_t n = 1; n <= 10; ++n) deliver_note(quick.address(), n, true);
  EXPECT_TRUE(seen().snapshot().empty());
  seen().release = true;
  ASSERT_TRUE(seen().wait_for(10));
  // Then idle again: later ones run here, after the queued ones.
  const int64_t next = deliver_until_here(quick.address(), 11);
  ASSERT_GT(next, 0);
  const auto notes = seen().snapshot();
  for (size_t i = 0; i < notes.size(); ++i) {
    EXPECT_EQ(notes[i].first, static_cast<int64_t>(i + 1));
    if (i < 10) {
      EXPECT_NE(notes[i].second, std::this_thread::get_id()) << "queued note " << i + 1 << " ran here";
    }
  }
}

TEST_F(ShortHandlers, AnAskFromAnotherProcIsAnsweredAndAThrowFailsTheActorOnAWorker) {
  auto quick = b_->spawn<Quick>();
  auto via_a = ActorRef<Quick>(a_->resolve(quick.address()).destination());
  // Every answer arrives, whichever thread ran the handler.
  for (int64_t n = 1; n <= 200; ++n) {
    auto r = via_a.ask(Note{n}).get(10s);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, n);
  }
  std::mutex mu;
  std::optional<DownEvent> down;
  b_->monitor(quick, [&](const DownEvent& e) {
    std::lock_guard lock(mu);
    down = e;
  });
  // Wait until the asks' runs let go of the actor, so the crash may run here.
  ASSERT_GT(deliver_until_here(quick.address(), 201), 0);
  auto crashed = via_a.ask(Crash{}).get(10s);
  EXPECT_EQ(crashed.status().code(), absl::StatusCode::kAborted) << crashed.status();
  EXPECT_NE(crashed.status().message().find("crash on purpose"), std::string::npos) << crashed.status();
  // The failure stops the actor, on_stop on a worker, and its monitor hears of it.
  for (int i = 0; i < 2000; ++i) {
    std::lock_guard lock(mu);
    if (down.has_value()) break;
    std::this_thread::sleep_for(5ms);
  }
  {
    std::lock_guard lock(mu);
    ASSERT_TRUE(down.has_value());
    EXPECT_NE(down->reason.message().find("crash on purpose"), std::string::npos) << down->reason;
  }
  {
    std::lock_guard lock(seen().mu);
    EXPECT_NE(seen().stopped_on, std::thread::id());
    EXPECT_NE(seen().stopped_on, std::this_thread::get_id());
  }
  // Stopped: later requests fail at once (kUnavailable while the stopped
  // cell is still in its proc's directory, kNotFound after).
  auto after = via_a.ask(Note{1}).get(10s);
  EXPECT_TRUE(after.status().code() == absl::StatusCode::kUnavailable ||
              after.status().code() == absl::StatusCode::kNotFound)
      << after.status();
}

}  // namespace
}  // namespace castmesh::testing
