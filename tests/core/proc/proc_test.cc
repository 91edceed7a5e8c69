// Cross-process tests: a controller (this test) and worker procs (this same
// binary, re-executed; castmesh::init in main() turns them into workers).
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "castmesh/actor.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "core/platform/process.h"
#include "core/testing/supervision_events.h"
#include "core/testing/test_messages.h"
#include "core/transport/address.h"
#include "core/transport/endpoint.h"

namespace {

using namespace std::chrono_literals;

// --- messages (each with a codec, so they can cross procs) ------------------

struct Ping {
  int64_t n = 0;
};
struct GetPid {};
struct GetTag {};
struct Seq {
  int64_t sender = 0;
  int64_t n = 0;
};
struct CheckOrder {};
struct Relay {
  std::string target;  // an ActorRef<Echo>, as bytes
  int64_t n = 0;
};
struct Boom {};
struct Hang {};
struct GetEnviron {};

using castmesh::testing::decode_decimal;
using castmesh::testing::decode_empty;
using castmesh::testing::encode_decimal;
using castmesh::testing::encode_empty;
absl::Status encode_ping(const Ping& m, std::string* out) { return encode_decimal(m.n, out); }
absl::Status decode_ping(std::string_view b, Ping* m) { return decode_decimal(b, &m->n); }
absl::Status encode_seq(const Seq& m, std::string* out) {
  *out = absl::StrCat(m.sender, ",", m.n);
  return absl::OkStatus();
}
absl::Status decode_seq(std::string_view b, Seq* m) {
  std::vector<std::string> parts = absl::StrSplit(absl::string_view(b.data(), b.size()), ',');
  if (parts.size() != 2) return absl::InvalidArgumentError("bad Seq");
  if (!absl::SimpleAtoi(parts[0], &m->sender) || !absl::SimpleAtoi(parts[1], &m->n)) {
    return absl::InvalidArgumentError("bad Seq");
  }
  return absl::OkStatus();
}
absl::Status encode_relay(const Relay& m, std::string* out) {
  *out = absl::StrCat(m.n, " ", m.target);
  return absl::OkStatus();
}
absl::Status decode_relay(std::string_view b, Relay* m) {
  const auto space = b.find(' ');
  if (space == std::string_view::npos) return absl::InvalidArgumentError("bad Relay");
  m->target = std::string(b.substr(space + 1));
  return decode_decimal(b.substr(0, space), &m->n);
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(Ping, "test.Ping", encode_ping, decode_ping);
CASTMESH_REGISTER_MESSAGE(GetPid, "test.GetPid", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(GetTag, "test.GetTag", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(Seq, "test.Seq", encode_seq, decode_seq);
CASTMESH_REGISTER_MESSAGE(CheckOrder, "test.CheckOrder", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(Relay, "test.Relay", encode_relay, decode_relay);
CASTMESH_REGISTER_MESSAGE(Boom, "test.Boom", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(Hang, "test.Hang", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(GetEnviron, "test.GetEnviron", encode_empty, decode_empty);

// --- actors -------------------------------------------------------------------

class Echo : public castmesh::Actor {
 public:
  explicit Echo(std::string tag) : tag_(std::move(tag)) {}
  int64_t echo(const Ping& p) { return p.n; }
  int64_t pid(const GetPid&) { return ::getpid(); }
  std::string tag(const GetTag&) { return tag_; }
  int64_t boom(const Boom&) { throw std::runtime_error("boom from a worker"); }
  int64_t hang(const Hang&) {
    std::this_thread::sleep_for(std::chrono::seconds(20));  // the test kills this proc meanwhile
    return 0;
  }
  // What a handler (user code) can see of the environment: each entry of
  // environ, then (Linux) /proc/self/environ, NUL-separated.
  std::string environ_seen(const GetEnviron&) {
    std::string seen;
    for (char** e = castmesh::platform::environment(); *e != nullptr; ++e) seen.append(*e).push_back('\0');
    std::ifstream initial("/proc/self/environ", std::ios::binary);
    seen.append(std::istreambuf_iterator<char>(initial), std::istreambuf_iterator<char>());
    return seen;
  }
  using Handlers =
      castmesh::Handlers<&Echo::echo, &Echo::pid, &Echo::tag, &Echo::boom, &Echo::hang, &Echo::environ_seen>;

 private:
  std::string tag_;
};
CASTMESH_REGISTER_ACTOR(Echo, std::string);

// Checks that messages from each sender arrive in the order sent.
class Recorder : public castmesh::Actor {
 public:
  void record(const Seq& s) {
    int64_t& last = last_[s.sender];
    if (s.n != last + 1 && error_.empty()) error_ = absl::StrCat("sender ", s.sender, ": ", s.n, " after ", last);
    last = s.n;
    ++count_;
  }
  std::string check(const CheckOrder&) { return error_.empty() ? absl::StrCat("ok ", count_) : error_; }
  using Handlers = castmesh::Handlers<&Recorder::record, &Recorder::check>;

 private:
  std::map<int64_t, int64_t> last_;
  int64_t count_ = 0;
  std::string error_;
};
CASTMESH_REGISTER_ACTOR(Recorder);

// Asks the Echo actor named in the message (a ref that travelled here).
class Relayer : public castmesh::Actor {
 public:
  castmesh::Future<int64_t> relay(const Relay& r) {
    auto target = castmesh::ActorRef<Echo>::from_bytes(r.target);
    if (!target.ok()) throw std::runtime_error(std::string(target.status().message()));
    return target->ask(Ping{r.n * 2});
  }
  using Handlers = castmesh::Handlers<&Relayer::relay>;
};
CASTMESH_REGISTER_ACTOR(Relayer);

namespace {

using Events = castmesh::testing::SupervisionEvents;

castmesh::LocalAllocatorOptions quick_options(Events* events = nullptr) {
  castmesh::LocalAllocatorOptions options;
  options.join_timeout = absl::Seconds(30);
  if (events != nullptr) options.on_supervision_event = events->handler();
  return options;
}

bool process_gone(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST(ProcMesh, RemoteTellAndAskWithConstructorArguments) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_EQ(mesh->size(), 2u);
  EXPECT_NE(mesh->proc(0).id, mesh->proc(1).id);
  EXPECT_EQ(mesh->proc(1).rank, 1);
  auto echoes = mesh->spawn<Echo>("echo", std::string("hello"));
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  ASSERT_EQ(echoes->size(), 2u);
  std::set<int64_t> pids;
  for (size_t rank = 0; rank < echoes->size(); ++rank) {
    const auto& ref = (*echoes)[rank];
    EXPECT_EQ(ref.address().proc, mesh->proc(rank).id);
    EXPECT_EQ(ref.address().index, rank);
    auto tag = ref.ask(GetTag{}).get(absl::Seconds(10));
    ASSERT_TRUE(tag.ok()) << tag.status();
    EXPECT_EQ(*tag, "hello");
    ref.tell(Ping{1});  // a tell, then an ask on the same pair
    auto n = ref.ask(Ping{static_cast<int64_t>(41 + rank)}).get(absl::Seconds(10));
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, static_cast<int64_t>(41 + rank));
    auto pid = ref.ask(GetPid{}).get(absl::Seconds(10));
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_EQ(*pid, mesh->proc(rank).pid);
    pids.insert(*pid);
  }
  EXPECT_EQ(pids.size(), 2u);
  EXPECT_EQ(pids.count(::getpid()), 0u);
  ASSERT_TRUE(mesh->stop().ok());
  for (const auto& p : mesh->procs()) EXPECT_TRUE(process_gone(static_cast<pid_t>(p.pid), 5s));
}

TEST(ProcMesh, AllocatedWithAShapeAndSliced) {
  castmesh::Runtime runtime;
  const auto shape = castmesh::Shape::Create({{"hosts", 1}, {"gpus", 4}});
  ASSERT_TRUE(shape.ok());
  std::optional<castmesh::ProcMesh> mesh;
  {
    auto allocated = castmesh::LocalAllocator(quick_options()).allocate(runtime, *shape);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    mesh = *std::move(allocated);
  }
  EXPECT_EQ(mesh->shape(), *shape);
  ASSERT_EQ(mesh->size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(mesh->proc(i).rank, static_cast<int>(i));

  // Every other gpu: a view over ranks 0 and 2, same workers.
  auto even = mesh->slice("gpus", castmesh::Range(0, 4, 2));
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(even->shape().labels(), (std::vector<std::string>{"hosts", "gpus"}));
  EXPECT_EQ(even->shape().sizes(), (std::vector<size_t>{1, 2}));
  ASSERT_EQ(even->size(), 2u);
  EXPECT_EQ(even->proc(0).rank, 0);
  EXPECT_EQ(even->proc(1).rank, 2);
  EXPECT_EQ(even->proc(1).pid, mesh->proc(2).pid);
  EXPECT_EQ(even->proc(1).id, mesh->proc(2).id);
  // A slice of the slice, and a single proc (dimensions dropped).
  auto third = even->slice("gpus", 1);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->shape().labels(), (std::vector<std::string>{"hosts"}));
  ASSERT_EQ(third->size(), 1u);
  EXPECT_EQ(third->proc(0).rank, 2);
  auto one = mesh->slice({{"hosts", 0}, {"gpus", 3}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->shape().ndim(), 0u);
  EXPECT_EQ(one->proc(0).rank, 3);
  // Clear errors.
  EXPECT_EQ(mesh->slice("gpu", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mesh->slice("gpus", 4).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(castmesh::ProcMesh().slice("gpus", 0).status().code(), absl::StatusCode::kFailedPrecondition);

  // Spawning on a slice puts one actor on each of its procs, indexed by rank.
  auto echoes = even->spawn<Echo>("even", std::string("e"));
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  ASSERT_EQ(echoes->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*echoes)[i].address().proc, even->proc(i).id);
    EXPECT_EQ((*echoes)[i].address().index, static_cast<uint64_t>(even->proc(i).rank));
    auto pid = (*echoes)[i].ask(GetPid{}).get(absl::Seconds(10));
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_EQ(*pid, even->proc(i).pid);
  }

  // A slice shares the workers: they outlive the mesh it came from.
  const std::vector<castmesh::ProcInfo> all = mesh->procs();
  mesh.reset();
  auto n = (*echoes)[1].ask(Ping{6}).get(absl::Seconds(10));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 6);
  // stop() on a slice stops every worker of the mesh.
  ASSERT_TRUE(third->stop().ok());
  for (const auto& p : all) EXPECT_TRUE(process_gone(static_cast<pid_t>(p.pid), 5s));
}

TEST(ProcMesh, CountAllocationHasOneDimension) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->shape(), *castmesh::Shape::Create({{"procs", 2}}));
  EXPECT_EQ(mesh->slice("procs", 1)->proc(0).rank, 1);
  EXPECT_EQ(castmesh::LocalAllocator().allocate(runtime, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProcMesh, WorksOverTcpLoopback) {
  castmesh::Runtime runtime;
  castmesh::LocalAllocatorOptions options = quick_options();
  options.transport = "tcp";
  auto mesh = castmesh::LocalAllocator(options).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->proc(0).id.rfind("tcp:127.0.0.1:", 0), 0u) << mesh->proc(0).id;
  EXPECT_EQ(runtime.proc_id().rfind("tcp:127.0.0.1:", 0), 0u) << runtime.proc_id();
  auto echoes = mesh->spawn<Echo>("echo", std::string("tcp"));
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  auto relayers = mesh->spawn<Relayer>("relay");
  ASSERT_TRUE(relayers.ok()) << relayers.status();
  auto answer = (*relayers)[1].ask(Relay{(*echoes)[0].to_bytes(), 8}).get(absl::Seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, 16);
}

class NotRegistered : public castmesh::Actor {
 public:
  int64_t echo(const Ping& p) { return p.n; }
  using Handlers = castmesh::Handlers<&NotRegistered::echo>;
};

TEST(ProcMesh, SpawnErrorsAreClear) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto unregistered = mesh->spawn<NotRegistered>("x");
  ASSERT_FALSE(unregistered.ok());
  EXPECT_NE(unregistered.status().message().find("not registered"), std::string::npos) << unregistered.status();
  auto wrong_args = mesh->spawn<Echo>("echo", int64_t{5});  // registered with std::string
  ASSERT_FALSE(wrong_args.ok());
  EXPECT_NE(wrong_args.status().message().find("do not match"), std::string::npos) << wrong_args.status();
  auto fine = mesh->spawn<Echo>("echo", std::string("ok"));
  EXPECT_TRUE(fine.ok()) << fine.status();
}

TEST(ProcMesh, MessagesFromOneSenderArriveInOrder) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto recorders = mesh->spawn<Recorder>("recorder");
  ASSERT_TRUE(recorders.ok()) << recorders.status();
  const auto& recorder = (*recorders)[0];
  constexpr int kThreads = 3, kEach = 2000;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 1; i <= kEach; ++i) recorder.tell(Seq{t, i});
    });
  }
  for (auto& s : senders) s.join();
  auto verdict = recorder.ask(CheckOrder{}).get(absl::Seconds(30));
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, absl::StrCat("ok ", kThreads * kEach));
}

TEST(ProcMesh, RefPassedInAMessageWorksFromAThirdProc) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  auto relayers = mesh->spawn<Relayer>("relay");
  ASSERT_TRUE(echoes.ok() && relayers.ok());
  // The controller asks the relayer on rank 0, which asks the echo on rank 1
  // directly (worker to worker), through a ref that came inside the message.
  auto answer = (*relayers)[0].ask(Relay{(*echoes)[1].to_bytes(), 21}).get(absl::Seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, 42);
}

TEST(ProcMesh, HandlerFailureOnAWorkerReachesTheSpawner) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());
  auto failed = (*echoes)[0].ask(Boom{}).get(absl::Seconds(10));
  EXPECT_FALSE(failed.ok());
  auto event = events.wait_for_child((*echoes)[0].address());
  ASSERT_TRUE(event.has_value());
  EXPECT_NE(event->reason.message().find("boom from a worker"), std::string::npos) << event->reason;
}

// Collects the DownEvents of Runtime::monitor callbacks.
struct Downs {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<castmesh::DownEvent> events;
  std::function<void(const castmesh::DownEvent&)> callback() {
    return [this](const castmesh::DownEvent& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  // Waits until `n` events arrived; returns them all.
  std::vector<castmesh::DownEvent> wait_for(size_t n, std::chrono::seconds timeout = 10s) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, timeout, [&] { return events.size() >= n; });
    return events;
  }
};

TEST(RemoteMonitor, ActorThatFailsAloneInALiveProcIsReported) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  auto others = mesh->spawn<Echo>("other", std::string("o"));
  ASSERT_TRUE(echoes.ok() && others.ok());
  const auto& failing = (*echoes)[0];
  Downs downs, other_downs;
  runtime.monitor(failing, downs.callback());
  runtime.monitor(failing, downs.callback());  // a second monitor of the same actor
  runtime.monitor((*others)[0], other_downs.callback());

  EXPECT_FALSE(failing.ask(Boom{}).get(absl::Seconds(10)).ok());
  auto seen = downs.wait_for(2);
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& e : seen) {
    EXPECT_EQ(e.actor, failing.address());
    EXPECT_EQ(e.reason.code(), absl::StatusCode::kInternal) << e.reason;
    EXPECT_NE(e.reason.message().find("boom from a worker"), std::string::npos) << e.reason;
    EXPECT_NE(e.message_type.find("Boom"), std::string::npos) << e.message_type;
  }
  // The proc lives on: its other actor answers and is not reported down.
  auto alive = (*others)[0].ask(Ping{4}).get(absl::Seconds(10));
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_EQ(*alive, 4);
  EXPECT_TRUE(other_downs.wait_for(1, 0s).empty());
  // The supervision event reached the spawner too.
  ASSERT_TRUE(events.wait_for_child(failing.address()).has_value());

  // Killing the proc now reports the other actor, and nothing more about
  // the failed one (its monitors were told once; its spawner too).
  ASSERT_EQ(::kill(static_cast<pid_t>(mesh->proc(0).pid), SIGKILL), 0);
  auto other_seen = other_downs.wait_for(1);
  ASSERT_EQ(other_seen.size(), 1u);
  EXPECT_EQ(other_seen[0].reason.code(), absl::StatusCode::kUnavailable) << other_seen[0].reason;
  ASSERT_TRUE(events.wait_for_child((*others)[0].address()).has_value());
  EXPECT_EQ(downs.wait_for(3, 0s).size(), 2u);
  std::lock_guard lock(events.mu);
  EXPECT_EQ(std::count_if(events.events.begin(), events.events.end(),
                          [&](const auto& e) { return e.child == failing.address(); }),
            1);
}

// Supervision events for spawned actors: one per actor that fails, none for
// one that stopped normally, even when their proc dies later.
TEST(ProcMesh, StoppedOrFailedChildIsNotReportedAgainWhenItsProcDies) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto stopped = mesh->spawn<Echo>("stopped", std::string("s"));
  auto failing = mesh->spawn<Echo>("failing", std::string("f"));
  auto alive = mesh->spawn<Echo>("alive", std::string("a"));
  ASSERT_TRUE(stopped.ok() && failing.ok() && alive.ok());
  Downs downs;
  runtime.monitor((*stopped)[0], downs.callback());
  (*stopped)[0].stop();
  ASSERT_EQ(downs.wait_for(1).size(), 1u);
  EXPECT_FALSE((*failing)[0].ask(Boom{}).get(absl::Seconds(10)).ok());
  ASSERT_TRUE(events.wait_for_child((*failing)[0].address()).has_value());

  ASSERT_EQ(::kill(static_cast<pid_t>(mesh->proc(0).pid), SIGKILL), 0);
  auto lost = events.wait_for_child((*alive)[0].address());
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->reason.code(), absl::StatusCode::kUnavailable) << lost->reason;
  std::lock_guard lock(events.mu);
  std::vector<std::string> children;
  for (const auto& e : events.events) children.push_back(e.child.name);
  EXPECT_EQ(children, (std::vector<std::string>{"failing", "alive"}));
}

TEST(RemoteMonitor, DemonitoredRemoteActorIsNotToldAndOtherMonitorsAre) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());
  const auto& echo = (*echoes)[0];
  Downs removed, kept;
  const castmesh::MonitorId removed_id = runtime.monitor(echo, removed.callback());
  const castmesh::MonitorId kept_id = runtime.monitor(echo, kept.callback());
  EXPECT_TRUE(runtime.demonitor(echo, removed_id));
  EXPECT_FALSE(runtime.demonitor(echo, removed_id));
  echo.stop();
  // Both are told in one batch, in the order added: once `kept` is told,
  // `removed` would have been too.
  ASSERT_EQ(kept.wait_for(1).size(), 1u);
  EXPECT_TRUE(removed.wait_for(1, 0s).empty());
  EXPECT_FALSE(runtime.demonitor(echo, kept_id));

  // A monitor removed at once, the actor stopped, then a new monitor: the
  // new one is told (by the stop's report or, if that came first, by the
  // proc asked again), the removed one never.
  auto others = mesh->spawn<Echo>("other", std::string("o"));
  ASSERT_TRUE(others.ok());
  const auto& other = (*others)[0];
  Downs first, second;
  EXPECT_TRUE(runtime.demonitor(other, runtime.monitor(other, first.callback())));
  other.stop();
  EXPECT_FALSE(other.ask(Ping{1}).get(absl::Seconds(10)).ok());
  runtime.monitor(other, second.callback());
  ASSERT_EQ(second.wait_for(1).size(), 1u);
  EXPECT_TRUE(first.wait_for(1, 0s).empty());
}

TEST(RemoteMonitor, StoppedAndUnknownActorsAreReportedPromptly) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());

  // A normal stop: reason OK.
  Downs stopped;
  runtime.monitor((*echoes)[0], stopped.callback());
  const auto stop_at = std::chrono::steady_clock::now();
  (*echoes)[0].stop();
  auto seen = stopped.wait_for(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].reason.ok()) << seen[0].reason;
  std::printf("remote stop reported %.0f us after stop()\n",
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - stop_at).count());

  // Monitoring it again, now that it stopped: down at once (with its final
  // reason while its proc still holds its cell, else NOT_FOUND).
  Downs again;
  runtime.monitor((*echoes)[0], again.callback());
  auto again_events = again.wait_for(1);
  ASSERT_EQ(again_events.size(), 1u);
  EXPECT_TRUE(again_events[0].reason.ok() || again_events[0].reason.code() == absl::StatusCode::kNotFound)
      << again_events[0].reason;
  // An actor that never was.
  Downs ghost;
  const castmesh::Address ghost_address{mesh->proc(0).id, "ghost", 7};
  const auto ghost_at = std::chrono::steady_clock::now();
  runtime.monitor(runtime.resolve(ghost_address), ghost.callback());
  auto ghost_events = ghost.wait_for(1);
  ASSERT_EQ(ghost_events.size(), 1u);
  std::printf("monitor of an unknown remote actor answered after %.0f us\n",
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ghost_at).count());
  EXPECT_EQ(ghost_events[0].actor, ghost_address);
  EXPECT_EQ(ghost_events[0].reason.code(), absl::StatusCode::kNotFound) << ghost_events[0].reason;
  EXPECT_NE(ghost_events[0].reason.message().find("no actor " + ghost_address.to_string()), std::string::npos)
      << ghost_events[0].reason;

  // An actor of a proc that cannot be reached at all.
  Downs nowhere;
  const castmesh::Address nowhere_address{"unix:@castmesh-test-no-such-proc", "a", 1};
  runtime.monitor(runtime.resolve(nowhere_address), nowhere.callback());
  auto nowhere_events = nowhere.wait_for(1);
  ASSERT_EQ(nowhere_events.size(), 1u);
  EXPECT_EQ(nowhere_events[0].reason.code(), absl::StatusCode::kUnavailable) << nowhere_events[0].reason;
  EXPECT_NE(nowhere_events[0].reason.message().find(nowhere_address.proc), std::string::npos)
      << nowhere_events[0].reason;
}

// Remote DownEvents do not run on the transport's I/O thread: a callback
// that waits for an answer from another proc (which that thread delivers)
// gets it.
TEST(RemoteMonitor, CallbacksDoNotRunOnTheIoThread) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  auto others = mesh->spawn<Echo>("other", std::string("o"));
  ASSERT_TRUE(echoes.ok() && others.ok());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::StatusOr<int64_t>> answer;
  runtime.monitor((*echoes)[0], [&, other = (*others)[0]](const castmesh::DownEvent&) {
    auto r = other.ask(Ping{11}).get(absl::Seconds(5));
    std::lock_guard lock(mu);
    answer = std::move(r);
    cv.notify_all();
  });
  (*echoes)[0].stop();
  std::unique_lock lock(mu);
  cv.wait_for(lock, 20s, [&] { return answer.has_value(); });
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok()) << answer->status();
  EXPECT_EQ(**answer, 11);
}

// Watches a remote actor from inside an actor (Actor::monitor).
struct WatchIt {
  std::string target;  // an ActorRef, as bytes
};
struct CountDowns {};

}  // namespace

namespace {
absl::Status encode_watch(const WatchIt& m, std::string* out) {
  *out = m.target;
  return absl::OkStatus();
}
absl::Status decode_watch(std::string_view b, WatchIt* m) {
  m->target = std::string(b);
  return absl::OkStatus();
}
}  // namespace
CASTMESH_REGISTER_MESSAGE(WatchIt, "test.WatchIt", encode_watch, decode_watch);
CASTMESH_REGISTER_MESSAGE(CountDowns, "test.CountDowns", encode_empty, decode_empty);

// Counts the DownEvents it gets ("<count> <last reason code>").
class Watcher : public castmesh::Actor {
 public:
  void watch(const WatchIt& w) { monitor(castmesh::UntypedRef::from_bytes(w.target).value()); }
  void on_down(const castmesh::DownEvent& e) override {
    ++count_;
    last_ = e.reason.code();
  }
  std::string count(const CountDowns&) { return absl::StrCat(count_, " ", static_cast<int>(last_)); }
  using Handlers = castmesh::Handlers<&Watcher::watch, &Watcher::count>;

 private:
  int count_ = 0;
  absl::StatusCode last_ = absl::StatusCode::kOk;
};
CASTMESH_REGISTER_ACTOR(Watcher);

namespace {

TEST(RemoteMonitor, KilledProcFiresEveryMonitorExactlyOnce) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  auto watchers = mesh->spawn<Watcher>("watcher");
  ASSERT_TRUE(echoes.ok() && watchers.ok());
  const auto& doomed = (*echoes)[1];
  Downs a, b;
  runtime.monitor(doomed, a.callback());
  runtime.monitor(doomed, b.callback());
  // A worker (rank 0) watches the actor of rank 1 too, worker to worker.
  (*watchers)[0].tell(WatchIt{doomed.to_bytes()});
  ASSERT_EQ(*(*watchers)[0].ask(CountDowns{}).get(absl::Seconds(10)), "0 0");  // the watch is in place

  ASSERT_EQ(::kill(static_cast<pid_t>(mesh->proc(1).pid), SIGKILL), 0);
  for (auto* d : {&a, &b}) {
    auto events = d->wait_for(1);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].actor, doomed.address());
    EXPECT_EQ(events[0].reason.code(), absl::StatusCode::kUnavailable) << events[0].reason;
    EXPECT_NE(events[0].reason.message().find(mesh->proc(1).id), std::string::npos) << events[0].reason;
  }
  std::string worker_view;
  for (int i = 0; i < 1000; ++i) {
    worker_view = *(*watchers)[0].ask(CountDowns{}).get(absl::Seconds(10));
    if (worker_view != "0 0") break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(worker_view, absl::StrCat("1 ", static_cast<int>(absl::StatusCode::kUnavailable)));

  // A monitor added after the death is told too (the dead proc cannot be
  // reached); it comes after any duplicate of the first ones would have.
  Downs late;
  runtime.monitor(doomed, late.callback());
  auto late_events = late.wait_for(1);
  ASSERT_EQ(late_events.size(), 1u);
  EXPECT_EQ(late_events[0].reason.code(), absl::StatusCode::kUnavailable) << late_events[0].reason;
  EXPECT_EQ(a.wait_for(2, 0s).size(), 1u);
  EXPECT_EQ(b.wait_for(2, 0s).size(), 1u);
  EXPECT_EQ(*(*watchers)[0].ask(CountDowns{}).get(absl::Seconds(10)),
            absl::StrCat("1 ", static_cast<int>(absl::StatusCode::kUnavailable)));
}

TEST(ProcMesh, KilledProcFailsPendingAsksAndTellsTheSpawner) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());
  auto pending = (*echoes)[1].ask(Hang{});
  auto also_pending = (*echoes)[1].ask(Ping{7});  // queued behind Hang
  std::this_thread::sleep_for(100ms);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(static_cast<pid_t>(mesh->proc(1).pid), SIGKILL), 0);
  auto result = pending.get(absl::Seconds(10));
  const auto took = std::chrono::steady_clock::now() - killed_at;
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_NE(result.status().message().find(mesh->proc(1).id), std::string::npos) << result.status();
  std::printf("pending ask failed %.0f ms after SIGKILL: %s\n",
              std::chrono::duration<double, std::milli>(took).count(), result.status().ToString().c_str());
  EXPECT_FALSE(also_pending.get(absl::Seconds(10)).ok());
  auto event = events.wait_for_child((*echoes)[1].address());
  ASSERT_TRUE(event.has_value());
  EXPECT_NE(event->reason.message().find(mesh->proc(1).id), std::string::npos) << event->reason;
  // The surviving proc still serves, and new asks to the dead one fail.
  auto alive = (*echoes)[0].ask(Ping{5}).get(absl::Seconds(10));
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_EQ(*alive, 5);
  EXPECT_FALSE((*echoes)[1].ask(Ping{1}).get(absl::Seconds(10)).ok());
}

TEST(ProcMesh, PeerWithAWrongSecretIsRefusedAndTheProcKeepsServing) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());
  std::atomic<int> lost{0}, delivered{0};
  castmesh::transport::EndpointOptions options;
  options.secret = "wrong-secret";
  auto intruder = castmesh::transport::Endpoint::start(
      options, [&](const std::string&, castmesh::wire::v1::FrameHeader&&, castmesh::wire::Payload) { ++delivered; },
      [&](const std::string&, const absl::Status&) { ++lost; });
  ASSERT_TRUE(intruder.ok());
  castmesh::wire::v1::FrameHeader frame_header;
  frame_header.set_destination((*echoes)[0].to_string());
  ASSERT_TRUE((*intruder)->send(mesh->proc(0).id, frame_header).ok());
  for (int i = 0; i < 500 && lost == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(lost, 1);
  EXPECT_EQ(delivered, 0);
  auto n = (*echoes)[0].ask(Ping{3}).get(absl::Seconds(10));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
}

TEST(ProcMesh, MalformedFrameClosesOnlyThatConnection) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("e"));
  ASSERT_TRUE(echoes.ok());
  auto address = castmesh::transport::parse_channel_address(mesh->proc(0).id);
  // An abstract name on Linux, a socket file elsewhere.
  ASSERT_TRUE(address.ok() && address->kind == castmesh::transport::ChannelAddress::Kind::kUnix);
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const size_t offset = address->abstract ? 1 : 0;
  std::memcpy(sa.sun_path + offset, address->name.data(), address->name.size());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa),
                      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + offset + address->name.size())),
            0);
  const char garbage[] = "\x10\x00\x00\x00this is not a handshake";
  ASSERT_GT(::send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL), 0);
  char buf[256];
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);  // the challenge, then EOF
    closed = r <= 0;
  }
  ::close(fd);
  EXPECT_TRUE(closed);
  auto n = (*echoes)[0].ask(Ping{9}).get(absl::Seconds(10));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 9);
}

TEST(LocalAllocator, WorkerThatNeverJoinsTimesOutWithAClearError) {
  castmesh::Runtime runtime;
  castmesh::LocalAllocatorOptions options;
  options.worker_argv = {"sleep", "30"};
  options.join_timeout = absl::Milliseconds(500);
  auto mesh = castmesh::LocalAllocator(options).allocate(runtime, 2);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(mesh.status().message().find("did not join within 500ms"), std::string::npos) << mesh.status();
  EXPECT_NE(mesh.status().message().find("rank 0"), std::string::npos) << mesh.status();
}

TEST(LocalAllocator, WorkerThatExitsBeforeJoiningIsReported) {
  castmesh::Runtime runtime;
  castmesh::LocalAllocatorOptions options;
  options.worker_argv = {"false"};
  auto mesh = castmesh::LocalAllocator(options).allocate(runtime, 1);
  ASSERT_FALSE(mesh.ok());
  EXPECT_NE(mesh.status().message().find("exited before joining"), std::string::npos) << mesh.status();
}

TEST(LocalAllocator, WorkersNeverHaveTheSecretInTheirEnvironment) {
  castmesh::LocalAllocatorOptions options = quick_options();
  options.secret = "proc-test-secret-0123456789";
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(options).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<Echo>("echo", std::string("env"));
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  auto seen = (*echoes)[0].ask(GetEnviron{}).get(absl::Seconds(5));
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_NE(seen->find("CASTMESH_RANK=0"), std::string::npos);  // the environment was read
  EXPECT_EQ(seen->find(options.secret), std::string::npos);
  EXPECT_EQ(seen->find("CASTMESH_SECRET="), std::string::npos);
  ASSERT_TRUE(mesh->stop().ok());
}

TEST(LocalAllocator, MeshAllocatedOnAThreadThatExitsKeepsItsProcs) {
  // The workers' lifetime follows the controller process, not the thread
  // that started them (Linux's parent-death signal is per thread).
  castmesh::Runtime runtime;
  std::optional<absl::StatusOr<castmesh::ProcMesh>> mesh;
  std::thread([&] { mesh.emplace(castmesh::LocalAllocator(quick_options()).allocate(runtime, 2)); }).join();
  ASSERT_TRUE(mesh->ok()) << mesh->status();
  castmesh::ProcMesh& procs = **mesh;
  auto echoes = procs.spawn<Echo>("echo", std::string("alive"));
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  for (size_t rank = 0; rank < echoes->size(); ++rank) {
    auto n = (*echoes)[rank].ask(Ping{static_cast<int64_t>(7 + rank)}).get(absl::Seconds(5));
    ASSERT_TRUE(n.ok()) << "rank " << rank << ": " << n.status();
    EXPECT_EQ(*n, static_cast<int64_t>(7 + rank));
    EXPECT_EQ(::kill(static_cast<pid_t>(procs.proc(rank).pid), 0), 0) << "worker of rank " << rank << " is gone";
  }
  ASSERT_TRUE(procs.stop().ok());
}

TEST(LocalAllocator, WorkersExitWhenTheirControllerIsKilled) {
  // A controller process (this binary in role "controller") starts two
  // workers, keeps an actor of each busy (a 20 s handler, so that closing
  // the connection alone would not end them in time), reports their pids,
  // and is then SIGKILLed. (Linux: PR_SET_PDEATHSIG; elsewhere and in a
  // CASTMESH_POSIX_FALLBACKS build: the lifeline pipe.)
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipefd[0]);
  std::vector<std::string> env_strings = {"CASTMESH_TEST_ROLE=controller"};
  for (char** e = castmesh::platform::environment(); *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  absl::StatusOr<std::string> self = castmesh::platform::executable_path();
  ASSERT_TRUE(self.ok()) << self.status();
  char* argv[] = {self->data(), nullptr};
  pid_t controller = 0;
  ASSERT_EQ(::posix_spawn(&controller, self->c_str(), &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  std::string line;
  char c;
  while (::read(pipefd[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  ::close(pipefd[0]);
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  ASSERT_EQ(parts.size(), 2u) << "controller said: '" << line << "'";
  std::vector<pid_t> workers;
  for (const auto& p : parts) {
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(p, &pid));
    workers.push_back(pid);
  }
  ASSERT_EQ(::kill(controller, SIGKILL), 0);
  ::waitpid(controller, nullptr, 0);
  for (pid_t pid : workers) EXPECT_TRUE(process_gone(pid, 10s)) << "orphan worker " << pid << " still running";
}

// Role "controller" of the test above: allocate, print worker pids, wait.
int run_controller_role() {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator().allocate(runtime, 2);
  if (!mesh.ok()) {
    std::printf("error %s\n", mesh.status().ToString().c_str());
    return 1;
  }
  auto echoes = mesh->spawn<Echo>("echo", std::string("busy"));
  if (!echoes.ok()) {
    std::printf("error %s\n", echoes.status().ToString().c_str());
    return 1;
  }
  // Both handlers are running (a pid answer from behind them would wait).
  std::vector<decltype((*echoes)[0].ask(Hang{}))> hangs;
  for (size_t i = 0; i < echoes->size(); ++i) hangs.push_back((*echoes)[i].ask(Hang{}));
  std::this_thread::sleep_for(200ms);
  std::printf("%lld %lld\n", static_cast<long long>(mesh->proc(0).pid), static_cast<long long>(mesh->proc(1).pid));
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);  // killed long before
  return 0;
}

}  // namespace

// --- short handlers (castmesh/actor.h, kShortHandlers): a message that finds
// the actor idle runs on the worker proc's I/O thread ---------------------

class QuickEcho : public Echo {
 public:
  static constexpr bool kShortHandlers = true;
  QuickEcho() : Echo("quick") {}
};
CASTMESH_REGISTER_ACTOR(QuickEcho);

class QuickRecorder : public Recorder {
 public:
  static constexpr bool kShortHandlers = true;
};
CASTMESH_REGISTER_ACTOR(QuickRecorder);

namespace {

TEST(ShortHandlers, OrderHoldsAcrossRunsOnTheIoThreadAndOnWorkers) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto recorders = mesh->spawn<QuickRecorder>("quick_recorder");
  ASSERT_TRUE(recorders.ok()) << recorders.status();
  const auto& recorder = (*recorders)[0];
  // Bursts (queued behind a turn, handed to a worker) and lone messages
  // (run on the I/O thread) from several senders, interleaved.
  constexpr int kThreads = 3, kEach = 600;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 1; i <= kEach; ++i) {
        recorder.tell(Seq{t, i});
        if (i % 50 == 0) std::this_thread::sleep_for(1ms);
      }
    });
  }
  for (auto& s : senders) s.join();
  auto verdict = recorder.ask(CheckOrder{}).get(absl::Seconds(30));
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, absl::StrCat("ok ", kThreads * kEach));
}

TEST(ShortHandlers, RepliesRacingTimeoutsNeverReachAnotherAsk) {
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<QuickEcho>("quick_echo");
  ASSERT_TRUE(echoes.ok()) << echoes.status();
  const auto& echo = (*echoes)[0];
  int timed_out = 0;
  for (int64_t i = 1; i <= 300; ++i) {
    // A deadline about as long as the round trip: the reply races it.
    auto raced = echo.ask(Ping{i}).get(absl::Microseconds(i % 3 == 0 ? 0 : 40));
    if (raced.ok()) {
      EXPECT_EQ(*raced, i);
    } else {
      EXPECT_EQ(raced.status().code(), absl::StatusCode::kDeadlineExceeded) << raced.status();
      ++timed_out;
    }
    auto next = echo.ask(Ping{-i}).get(absl::Seconds(10));
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_EQ(*next, -i);
  }
  std::printf("%d of 300 raced asks timed out\n", timed_out);
}

TEST(ShortHandlers, AThrowingHandlerReachesTheSpawnerAndTheActorStops) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<QuickEcho>("quick_echo");
  ASSERT_TRUE(echoes.ok());
  const auto& echo = (*echoes)[0];
  for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(*echo.ask(Ping{i}).get(absl::Seconds(10)), i);
  auto failed = echo.ask(Boom{}).get(absl::Seconds(10));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("boom from a worker"), std::string::npos) << failed.status();
  auto event = events.wait_for_child(echo.address());
  ASSERT_TRUE(event.has_value());
  EXPECT_NE(event->reason.message().find("boom from a worker"), std::string::npos) << event->reason;
  auto after = echo.ask(Ping{1}).get(absl::Seconds(10));
  EXPECT_FALSE(after.ok());
  EXPECT_NE(after.status().code(), absl::StatusCode::kDeadlineExceeded) << after.status();
}

TEST(ShortHandlers, AsksInFlightFailWhenTheProcDies) {
  Events events;
  castmesh::Runtime runtime;
  auto mesh = castmesh::LocalAllocator(quick_options(&events)).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto echoes = mesh->spawn<QuickEcho>("quick_echo");
  ASSERT_TRUE(echoes.ok());
  const auto& echo = (*echoes)[0];
  // Three callers ask without pause until an ask fails: the proc is killed
  // while asks run on its I/O thread.
  constexpr int kCallers = 3;
  std::vector<absl::Status> last(kCallers);
  std::atomic<int> answered{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int64_t i = 0;; ++i) {
        auto r = echo.ask(Ping{i}).get(absl::Seconds(30));
        if (!r.ok()) {
          last[c] = r.status();
          return;
        }
        if (*r != i) {
          last[c] = absl::InternalError(absl::StrCat("asked ", i, ", answered ", *r));
          return;
        }
        answered.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 30000 && answered.load() < 300; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GE(answered.load(), 300);
  ASSERT_EQ(::kill(static_cast<pid_t>(mesh->proc(0).pid), SIGKILL), 0);
  for (auto& c : callers) c.join();
  for (const absl::Status& st : last) {
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find(mesh->proc(0).id), std::string::npos) << st;
  }
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs never return from here
  if (const char* role = std::getenv("CASTMESH_TEST_ROLE"); role != nullptr && std::string(role) == "controller") {
    ::unsetenv("CASTMESH_TEST_ROLE");
    return run_controller_role();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
