// Built-in metrics and user meters (castmesh/metrics.h): counts match the
// messages sent, in this process and across real worker procs (this binary
// re-executed); an observer reads every proc's snapshot through the
// controller, and the controller refuses its spawns and actor messages.
#include <gtest/gtest.h>

#include <string>

#include "castmesh/actor.h"
#include "castmesh/metrics.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/metrics/counters.h"
#include "core/proc/proc_host.h"
#include "core/testing/test_messages.h"

namespace castmesh::test_metrics {

struct Bump {
  int64_t n = 0;
};
absl::Status encode_bump(const Bump& m, std::string* out) { return testing::encode_decimal(m.n, out); }
absl::Status decode_bump(std::string_view b, Bump* m) { return testing::decode_decimal(b, &m->n); }
CASTMESH_REGISTER_MESSAGE(Bump, "castmesh.test.metrics.Bump", encode_bump, decode_bump);

class Adder : public Actor {
 public:
  int64_t add(const Bump& b) { return total_ += b.n; }
  using Handlers = castmesh::Handlers<&Adder::add>;

 private:
  int64_t total_ = 0;
};
CASTMESH_REGISTER_ACTOR(Adder);

// Tells `target` n times per message: its messages out.
class Forwarder : public Actor {
 public:
  explicit Forwarder(ActorRef<Adder> target) : target_(std::move(target)) {}
  int64_t add(const Bump& b) {
    for (int64_t i = 0; i < b.n; ++i) target_.tell(Bump{1});
    return b.n;
  }
  using Handlers = castmesh::Handlers<&Forwarder::add>;

 private:
  ActorRef<Adder> target_;
};

namespace {

const metrics::ActorMetrics* find_actor(const metrics::ProcMetrics& p, const std::string& name) {
  for (const metrics::ActorMetrics& a : p.actors) {
    if (a.name == name) return &a;
  }
  return nullptr;
}
// The answer points into `p`: never into a temporary snapshot.
const metrics::ActorMetrics* find_actor(metrics::ProcMetrics&& p, const std::string& name) = delete;

// A handler's run is counted after it returns, and its answer may reach the
// asker first: waits (bounded) until `name` has `runs` counted runs.
metrics::ProcMetrics snapshot_after_runs(const Runtime& runtime, const std::string& name, uint64_t runs) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    metrics::ProcMetrics snapshot = metrics::this_process(&runtime);
    const metrics::ActorMetrics* a = find_actor(snapshot, name);
    if ((a != nullptr && a->handler_count >= runs) || absl::Now() > deadline) return snapshot;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

const metrics::FlowMetrics* find_flow(const std::vector<metrics::FlowMetrics>& flows, const std::string& name) {
  for (const metrics::FlowMetrics& f : flows) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

LocalAllocatorOptions quick() {
  LocalAllocatorOptions options;
  options.join_timeout = absl::Seconds(30);
  return options;
}

TEST(Metrics, ActorCountsMatchTheMessagesInThisProcess) {
  Runtime runtime;
  absl::StatusOr<ActorRef<Adder>> adder = runtime.spawn_with<Adder>(SpawnOptions{.name = "adder"});
  ASSERT_TRUE(adder.ok()) << adder.status();
  absl::StatusOr<ActorRef<Forwarder>> forwarder =
      runtime.spawn_with<Forwarder>(SpawnOptions{.name = "forwarder"}, *adder);
  ASSERT_TRUE(forwarder.ok()) << forwarder.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(adder->ask(Bump{1}).get(absl::Seconds(10)).ok());
  ASSERT_TRUE(forwarder->ask(Bump{5}).get(absl::Seconds(10)).ok());
  // The five tells were sent before the forwarder answered; an ask behind them ends after them.
  absl::StatusOr<int64_t> total = adder->ask(Bump{0}).get(absl::Seconds(10));
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(*total, 15);

  const metrics::ProcMetrics snapshot = snapshot_after_runs(runtime, "adder", 16);
  ASSERT_TRUE(snapshot.status.ok()) << snapshot.status;
  const metrics::ActorMetrics* a = find_actor(snapshot, "adder");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->messages_in, 16u);  // 10 asks, 5 tells, the last ask
  EXPECT_EQ(a->handler_count, 16u);
  EXPECT_EQ(a->messages_out, 0u);
  EXPECT_EQ(a->mailbox_depth, 0u);
  EXPECT_GE(a->mailbox_max, 1u);
  ASSERT_EQ(a->handler_buckets.size(), metrics::kHandlerBucketBoundsNs.size() + 1);
  uint64_t in_buckets = 0;
  for (uint64_t b : a->handler_buckets) in_buckets += b;
  EXPECT_EQ(in_buckets, 16u);
  EXPECT_NE(a->actor_class.find("Adder"), std::string::npos) << a->actor_class;
  const metrics::ActorMetrics* f = find_actor(snapshot, "forwarder");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->messages_in, 1u);
  EXPECT_EQ(f->messages_out, 5u);
  EXPECT_EQ(snapshot.handler_bucket_bounds_ns.size(), metrics::kHandlerBucketBoundsNs.size());
  runtime.shutdown();
}

TEST(Metrics, UserMetersAppearInTheSnapshot) {
  absl::StatusOr<metrics::Counter> batches = metrics::counter("trainer", "batches");
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_TRUE(batches->add(2, "split=train").ok());
  ASSERT_TRUE(batches->add(3, "split=train").ok());
  ASSERT_TRUE(batches->add(1).ok());
  EXPECT_EQ(batches->add(-1).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<metrics::Histogram> loss = metrics::histogram("trainer", "loss");
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(loss->record(4).ok());
  ASSERT_TRUE(loss->record(400).ok());
  EXPECT_EQ(metrics::histogram("trainer", "batches").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(metrics::counter("trainer", "").status().code(), absl::StatusCode::kInvalidArgument);

  const metrics::ProcMetrics snapshot = metrics::this_process();
  const metrics::MeterInstrument* counter = nullptr;
  const metrics::MeterInstrument* histogram = nullptr;
  for (const metrics::MeterInstrument& i : snapshot.meters) {
    if (i.meter == "trainer" && i.name == "batches") counter = &i;
    if (i.meter == "trainer" && i.name == "loss") histogram = &i;
  }
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->kind, "counter");
  ASSERT_EQ(counter->series.size(), 2u);  // sorted by attributes: "" first
  EXPECT_EQ(counter->series[0].sum, 1);
  EXPECT_EQ(counter->series[1].attributes, "split=train");
  EXPECT_EQ(counter->series[1].sum, 5);
  EXPECT_EQ(counter->series[1].count, 2u);
  ASSERT_NE(histogram, nullptr);
  EXPECT_EQ(histogram->kind, "histogram");
  ASSERT_EQ(histogram->series.size(), 1u);
  EXPECT_EQ(histogram->series[0].count, 2u);
  EXPECT_EQ(histogram->series[0].min, 4);
  EXPECT_EQ(histogram->series[0].max, 400);
  ASSERT_EQ(histogram->series[0].buckets.size(), snapshot.histogram_bounds.size() + 1);
  EXPECT_EQ(histogram->series[0].buckets[1], 1u);  // (0, 5]
  EXPECT_EQ(histogram->series[0].buckets[8], 1u);  // (250, 500]
}

TEST(Metrics, CollectCountsCallsToAnActorInAWorkerProc) {
  Runtime runtime;
  absl::StatusOr<ProcMesh> mesh = LocalAllocator(quick()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto adders = mesh->spawn<Adder>("adders");
  ASSERT_TRUE(adders.ok()) << adders.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*adders)[1].ask(Bump{1}).get(absl::Seconds(10)).ok());

  absl::StatusOr<std::vector<metrics::ProcMetrics>> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {  // the last run is counted after its answer left (see snapshot_after_runs)
    got = metrics::collect(*mesh, absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    const metrics::ActorMetrics* a = find_actor((*got)[1], "adders");
    if (a != nullptr && a->handler_count >= 10) break;
    absl::SleepFor(absl::Milliseconds(1));
  } while (absl::Now() < deadline);
  for (size_t rank = 0; rank < 2; ++rank) {
    const metrics::ProcMetrics& p = (*got)[rank];
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_EQ(p.proc.id, mesh->proc(rank).id);
    EXPECT_EQ(p.proc_id, mesh->proc(rank).id);
    EXPECT_EQ(p.pid, mesh->proc(rank).pid);
    const metrics::ActorMetrics* a = find_actor(p, "adders");
    ASSERT_NE(a, nullptr) << "rank " << rank;
    EXPECT_EQ(a->index, rank);
    EXPECT_EQ(a->messages_in, rank == 1 ? 10u : 0u);
    EXPECT_EQ(a->handler_count, rank == 1 ? 10u : 0u);
    const metrics::FlowMetrics* unix_flow = find_flow(p.transports, "unix");
    ASSERT_NE(unix_flow, nullptr);
    EXPECT_GT(unix_flow->messages_in, 0u);
    EXPECT_GT(unix_flow->bytes_out, 0u);
    if (rank == 1) {
      EXPECT_GE(unix_flow->messages_in, 10u);
    }
  }
  EXPECT_EQ(metrics::collect(*mesh, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(mesh->stop().ok());
}

TEST(Metrics, AnObserverReadsEveryProcAndIsRefusedSpawnsAndSends) {
  Runtime runtime;
  absl::StatusOr<ProcMesh> mesh = LocalAllocator(quick()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<ActorRef<Adder>> local = runtime.spawn_with<Adder>(SpawnOptions{.name = "local_adder"});
  ASSERT_TRUE(local.ok()) << local.status();
  absl::StatusOr<metrics::ObserverTarget> target = metrics::observer_target(runtime);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->address, runtime.proc_id());

  EXPECT_FALSE(metrics::Observer::connect(target->address, "not the secret", "test", absl::Seconds(5)).ok());
  absl::StatusOr<std::unique_ptr<metrics::Observer>> observer =
      metrics::Observer::connect(target->address, target->secret, "test", absl::Seconds(10));
  ASSERT_TRUE(observer.ok()) << observer.status();
  EXPECT_EQ((*observer)->target_label(), runtime.proc_id());

  absl::StatusOr<std::vector<metrics::ProcMetrics>> got = (*observer)->metrics(absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);  // the controller, then its one proc
  EXPECT_EQ((*got)[0].proc_id, runtime.proc_id());
  EXPECT_NE(find_actor((*got)[0], "local_adder"), nullptr);
  EXPECT_EQ((*got)[1].proc_id, mesh->proc(0).id);
  for (const metrics::ProcMetrics& p : *got) EXPECT_TRUE(p.status.ok()) << p.status;

  // An actor message from the observer: its ask fails with the refusal.
  UntypedRef remote = (*observer)->runtime().resolve(local->address());
  absl::StatusOr<ActorRef<Adder>> typed = remote.as<Adder>();
  ASSERT_TRUE(typed.ok()) << typed.status();
  absl::StatusOr<int64_t> sent = typed->ask(Bump{1}).get(absl::Seconds(10));
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kFailedPrecondition) << sent.status();
  EXPECT_NE(sent.status().message().find("read-only observer"), std::string::npos) << sent.status();
  const metrics::ProcMetrics after_refusal = metrics::this_process(&runtime);  // find_actor points into it
  const metrics::ActorMetrics* a = find_actor(after_refusal, "local_adder");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->messages_in, 0u);

  {
    // A spawn request from the observer: refused the same way. (The host
    // must go before the observer, which owns its runtime.)
    std::shared_ptr<proc::ProcHost> observer_host = proc::ProcHost::of((*observer)->runtime());
    ASSERT_NE(observer_host, nullptr);
    wire::v1::SpawnRequest spawn;
    spawn.set_actor_type("castmesh::test_metrics::Adder");
    spawn.set_name("sneaky");
    absl::StatusOr<std::string> spawned = observer_host->request(target->address, spawn, absl::Seconds(10));
    ASSERT_FALSE(spawned.ok());
    EXPECT_EQ(spawned.status().code(), absl::StatusCode::kFailedPrecondition) << spawned.status();
    EXPECT_NE(spawned.status().message().find("read-only observer"), std::string::npos) << spawned.status();
  }

  // The controller still serves its own procs.
  auto adders = mesh->spawn<Adder>("adders");
  ASSERT_TRUE(adders.ok()) << adders.status();
  EXPECT_TRUE((*adders)[0].ask(Bump{1}).get(absl::Seconds(10)).ok());
  observer->reset();
  ASSERT_TRUE(mesh->stop().ok());
}

TEST(Metrics, TransportOfAnAddress) {
  EXPECT_EQ(metrics::transport_of("unix:@castmesh-1"), metrics::Transport::kUnix);
  EXPECT_EQ(metrics::transport_of("tcp:10.0.0.1:4000"), metrics::Transport::kTcp);
  EXPECT_EQ(metrics::transport_of("local"), metrics::Transport::kOther);
}

}  // namespace
}  // namespace castmesh::test_metrics
