// Device collectives through the real dispatch path (Communicator ->
// device_collectives -> the core's plugin loader -> te_backend.c/te_engine.c)
// over the FAKE CUDA+NCCL plugin (no GPU here): results, stream ordering,
// request completion, buffer lifetime, the watchdog (async error, hung
// peer), unsupported ops and bad arguments. Ranks are members of an
// in-process mesh, each on its own fake GPU; the fake NCCL's ranks meet in
// process-wide state and reduce real host memory.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "castmesh/backend.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"
#include "core/collectives/fake_tensor_engine.h"

namespace castmesh {
namespace {

using testing::fail;
using testing::fake_engine;
using testing::Gate;
using testing::FakeDeviceMeshTest;
using testing::gpu;
using testing::on_device;
using testing::Outcome;
using testing::to_host;

void expect_ok(const std::vector<Outcome>& outcomes, size_t n) {
  ASSERT_EQ(outcomes.size(), n);
  for (size_t r = 0; r < n; ++r) EXPECT_EQ(outcomes[r].error, "") << "rank " << r;
}

// A fake kernel that fills a float buffer with rank + 1 + i.
struct Fill {
  float* data;
  int64_t n;
  int rank;
  static void run(void* arg) {
    Fill* f = static_cast<Fill*>(arg);
    for (int64_t i = 0; i < f->n; ++i) f->data[i] = static_cast<float>(f->rank + 1 + i);
  }
};

TEST(FakeTensorEngine, DevicesStreamsAndCopies) {
  fake_engine();
  absl::StatusOr<std::vector<DeviceInfo>> devices = device_list();
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(devices->size(), 4u);
  auto t = on_device<int32_t>({1, 2, 3}, DType::kInt32, gpu(1));
  ASSERT_TRUE(t.ok()) << t.status();
  auto back = to_host<int32_t>(*t);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, (std::vector<double>{1, 2, 3}));
  auto s = DeviceStream::Create(gpu(0));
  ASSERT_TRUE(s.ok());
  int32_t host[3];
  EXPECT_EQ(device_copy(TensorView::Contiguous(host, DType::kInt32, {3}), *t, *s).code(),
            absl::StatusCode::kInvalidArgument);  // stream of another device
  // An event orders another stream after the work it captured.
  auto held = DeviceStream::Create(gpu(1));
  auto other = DeviceStream::Create(gpu(1));
  auto event = DeviceEvent::Create(gpu(1));
  ASSERT_TRUE(held.ok() && other.ok() && event.ok());
  Gate gate;
  fake_engine().launch(held->handle(), &Gate::wait, &gate);
  ASSERT_TRUE(event->record(*held).ok());
  ASSERT_TRUE(event->order_before(*other).ok());
  int32_t copied[3] = {0, 0, 0};
  ASSERT_TRUE(device_copy(TensorView::Contiguous(copied, DType::kInt32, {3}), *t, *other).ok());
  EXPECT_FALSE(*event->query());
  EXPECT_FALSE(*other->query());  // waits for the event
  gate.release();
  ASSERT_TRUE(other->synchronize().ok());
  EXPECT_TRUE(*event->query());
  EXPECT_EQ(copied[2], 3);
  EXPECT_EQ(event->record(*s).code(), absl::StatusCode::kInvalidArgument);  // stream of another device
  EXPECT_EQ(DeviceStream::Create(gpu(7)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceStream::Create(Device{DeviceKind::kRocm, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

// The caller's stream: the allreduce runs after the kernel already queued
// there (which fills the input), wait_stream orders another stream after it
// without blocking the CPU, and wait() blocks until it ran.
TEST_F(FakeDeviceMeshTest, AllreduceRunsInStreamOrderAndWaitStreamDoesNotBlock) {
  constexpr int kRanks = 3;
  constexpr int64_t kCount = 1000;
  auto outcomes = run(kRanks, [](Communicator& c) {
    auto stream = DeviceStream::Create(gpu(c.rank()));
    auto after = DeviceStream::Create(gpu(c.rank()));
    auto buf = device_empty(DType::kFloat32, {kCount}, gpu(c.rank()));
    if (!stream.ok() || !after.ok() || !buf.ok()) return fail(absl::InternalError("setup"));
    Gate gate;
    Fill fill{static_cast<float*>(buf->data()), kCount, c.rank()};
    fake_engine().launch(stream->handle(), &Gate::wait, &gate);
    fake_engine().launch(stream->handle(), &Fill::run, &fill);
    Request req = c.iallreduce(*buf, *buf, ReduceOp::kSum, DeviceOptions{.stream = *stream});
    std::vector<double> got;
    got.push_back(req.test().has_value() ? 1 : 0);  // the stream is held: cannot be done
    if (absl::Status st = req.wait_stream(*after); !st.ok()) return fail(st);
    std::vector<float> host(kCount);
    if (absl::Status st = device_copy(TensorView::Contiguous(host.data(), DType::kFloat32, {kCount}), *buf, *after);
        !st.ok()) {
      return fail(st);
    }
    got.push_back(req.test().has_value() ? 1 : 0);  // wait_stream did not wait
    gate.release();
    if (absl::Status st = after->synchronize(); !st.ok()) return fail(st);
    if (absl::Status st = req.wait(absl::Seconds(30)).status(); !st.ok()) return fail(st);
    got.insert(got.end(), host.begin(), host.end());
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, kRanks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(outcomes[r].values.size(), 2u + kCount);
    EXPECT_EQ(outcomes[r].values[0], 0) << "completed while its stream was held";
    EXPECT_EQ(outcomes[r].values[1], 0) << "wait_stream blocked until completion";
    for (int64_t i = 0; i < kCount; i += 97) {
      double want = 0;
      for (int k = 0; k < kRanks; ++k) want += k + 1 + i;
      EXPECT_EQ(outcomes[r].values[2 + i], want) << "rank " << r << " i " << i;
    }
  }
}

// Every collective on the communicator's own stream, blocking and not.
TEST_F(FakeDeviceMeshTest, EveryCollectiveMatchesTheHostReference) {
  constexpr int kRanks = 3;
  auto outcomes = run(kRanks, [](Communicator& c) {
    const int r = c.rank();
    const Device d = gpu(r);
    std::vector<double> got;
    auto take = [&](const absl::StatusOr<TensorView>& t) -> absl::Status {
      if (!t.ok()) return t.status();
      auto v = to_host<int64_t>(*t);
      if (!v.ok()) return v.status();
      got.insert(got.end(), v->begin(), v->end());
      return absl::OkStatus();
    };
    // allreduce (max), blocking.
    auto a = on_device<int64_t>({r, 10 * r}, DType::kInt64, d);
    if (!a.ok()) return fail(a.status());
    if (absl::Status st = c.allreduce(*a, *a, ReduceOp::kMax); !st.ok()) return fail(st);
    if (absl::Status st = take(a); !st.ok()) return fail(st);
    // broadcast from rank 1.
    auto b = on_device<int64_t>({100 + r, 200 + r}, DType::kInt64, d);
    if (absl::Status st = c.broadcast(*b, 1); !st.ok()) return fail(st);
    if (absl::Status st = take(b); !st.ok()) return fail(st);
    // allgather.
    auto in = on_device<int64_t>({r}, DType::kInt64, d);
    auto all = device_empty(DType::kInt64, {kRanks}, d);
    if (absl::Status st = c.iallgather(*in, *all).wait().status(); !st.ok()) return fail(st);
    if (absl::Status st = take(all); !st.ok()) return fail(st);
    // reduce_scatter (sum): rank r's block r = sum over ranks of (k*10 + r).
    std::vector<int64_t> rs;
    for (int k = 0; k < kRanks; ++k) rs.push_back(r * 10 + k);
    auto rs_in = on_device<int64_t>(rs, DType::kInt64, d);
    auto rs_out = device_empty(DType::kInt64, {1}, d);
    if (absl::Status st = c.reduce_scatter(*rs_in, *rs_out, ReduceOp::kSum); !st.ok()) return fail(st);
    if (absl::Status st = take(rs_out); !st.ok()) return fail(st);
    // reduce (sum) to rank 2: only the root's output is written.
    auto red_in = on_device<int64_t>({r + 1}, DType::kInt64, d);
    auto red_out = on_device<int64_t>({-1}, DType::kInt64, d);
    if (absl::Status st = c.reduce(*red_in, *red_out, ReduceOp::kSum, 2); !st.ok()) return fail(st);
    if (absl::Status st = take(red_out); !st.ok()) return fail(st);
    // gather to rank 0, scatter from rank 0.
    auto g_in = on_device<int64_t>({7 * r}, DType::kInt64, d);
    auto g_out = on_device<int64_t>({-1, -1, -1}, DType::kInt64, d);
    if (absl::Status st = c.gather(*g_in, *g_out, 0); !st.ok()) return fail(st);
    if (absl::Status st = take(g_out); !st.ok()) return fail(st);
    auto s_in = on_device<int64_t>({5, 6, 7}, DType::kInt64, d);
    auto s_out = device_empty(DType::kInt64, {1}, d);
    if (absl::Status st = c.scatter(*s_in, *s_out, 0); !st.ok()) return fail(st);
    if (absl::Status st = take(s_out); !st.ok()) return fail(st);
    // alltoall in place: block j of rank i -> block i of rank j.
    auto x = on_device<int64_t>({10 * r + 0, 10 * r + 1, 10 * r + 2}, DType::kInt64, d);
    if (absl::Status st = c.ialltoall(*x, *x).wait().status(); !st.ok()) return fail(st);
    if (absl::Status st = take(x); !st.ok()) return fail(st);
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, kRanks));
  for (int r = 0; r < kRanks; ++r) {
    std::vector<double> want = {2, 20, 101, 201, 0, 1, 2};
    want.push_back(0 * 10 + r + 1 * 10 + r + 2 * 10 + r);  // reduce_scatter block r
    want.push_back(r == 2 ? 6 : -1);                       // reduce
    if (r == 0)
      want.insert(want.end(), {0, 7, 14});
    else
      want.insert(want.end(), {-1, -1, -1});                               // gather
    want.push_back(5 + r);                                                 // scatter
    want.insert(want.end(), {double(r), double(10 + r), double(20 + r)});  // alltoall
    EXPECT_EQ(outcomes[r].values, want) << "rank " << r;
  }
}

// dup() gives a device communicator of its own: interleaved requests on the
// two never mix (each has its own unique id and NCCL communicator).
TEST_F(FakeDeviceMeshTest, DupAndParentRunConcurrentlyWithoutMixing) {
  auto outcomes = run(2, [](Communicator& c) {
    auto dup = c.dup();
    if (!dup.ok()) return fail(dup.status());
    auto a = on_device<float>({float(c.rank() + 1)}, DType::kFloat32, gpu(c.rank()));
    auto b = on_device<float>({float(100 * (c.rank() + 1))}, DType::kFloat32, gpu(c.rank()));
    Request ra = c.iallreduce(*a, *a, ReduceOp::kSum);
    Request rb = dup->iallreduce(*b, *b, ReduceOp::kProd);
    if (absl::Status st = Request::wait_all({ra, rb}, absl::Seconds(30)); !st.ok()) return fail(st);
    auto va = to_host<float>(*a);
    auto vb = to_host<float>(*b);
    if (!va.ok() || !vb.ok()) return fail(absl::InternalError("copy back"));
    return Outcome{"", {(*va)[0], (*vb)[0]}};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{3, 20000}));
}

// A dup'ed communicator's NCCL communicator is destroyed once the dup is
// gone (at the next device call, which drops the dead groups' state).
TEST_F(FakeDeviceMeshTest, ADeadDupsDeviceCommunicatorIsDestroyed) {
  auto outcomes = run(2, [](Communicator& c) {
    auto buf = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!buf.ok()) return fail(buf.status());
    if (absl::Status st = c.allreduce(*buf, *buf, ReduceOp::kSum); !st.ok()) return fail(st);
    {
      auto dup = c.dup();
      if (!dup.ok()) return fail(dup.status());
      if (absl::Status st = dup->allreduce(*buf, *buf, ReduceOp::kSum); !st.ok()) return fail(st);
    }
    if (absl::Status st = c.barrier(); !st.ok()) return fail(st);
    const int64_t with_dup = fake_engine().live_comms();
    if (absl::Status st = c.barrier(); !st.ok()) return fail(st);
    if (absl::Status st = c.allreduce(*buf, *buf, ReduceOp::kSum); !st.ok()) return fail(st);
    if (absl::Status st = c.barrier(); !st.ok()) return fail(st);
    int64_t now = fake_engine().live_comms();
    for (int i = 0; i < 10000 && now != with_dup - 2; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
      now = fake_engine().live_comms();
    }
    return Outcome{"", {double(with_dup - now)}};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{2}));
}

// A request dropped with its buffers while the work waits on the stream:
// the memory stays allocated until the work ran, then is freed.
TEST_F(FakeDeviceMeshTest, BuffersLiveUntilTheWorkRan) {
  auto outcomes = run(2, [](Communicator& c) {
    auto stream = DeviceStream::Create(gpu(c.rank()));
    if (!stream.ok()) return fail(stream.status());
    auto released = std::make_shared<std::atomic<bool>>(false);
    Gate gate;
    {
      auto buf = device_empty(DType::kFloat32, {256}, gpu(c.rank()));
      if (!buf.ok()) return fail(buf.status());
      // An owner that records when the last reference to the memory goes.
      std::shared_ptr<void> marker(new int(0), [released](void* p) {
        delete static_cast<int*>(p);
        released->store(true);
      });
      std::shared_ptr<void> inner = buf->owner();
      TensorView tracked = buf->with_owner(std::shared_ptr<void>(inner.get(), [inner, marker](void*) mutable {
        inner.reset();
        marker.reset();
      }));
      fake_engine().launch(stream->handle(), &Gate::wait, &gate);
      c.iallreduce(tracked, tracked, ReduceOp::kSum, DeviceOptions{.stream = *stream});
    }
    std::vector<double> got = {released->load() ? 1.0 : 0.0};
    gate.release();
    for (int i = 0; i < 30000 && !released->load(); ++i) absl::SleepFor(absl::Milliseconds(1));
    got.push_back(released->load() ? 1 : 0);
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{0, 1}));
}

// A peer dies (the fake's async error): the watchdog fails the pending
// request naming the cause and aborts the device communicator; later device
// calls on it fail clearly; host collectives keep working.
//
// The fake "kills" rank 1 by setting the async error of every other rank's
// NCCL communicator while rank 1 itself runs on. So rank 1 dies only after a
// barrier that follows the first allreduce: without it, rank 1 (done with its
// allreduce) may kill before rank 0's copy of that allreduce completed, and
// the watchdog then rightly fails it too (a peer died while it was pending).
// Every host collective below is called by every rank whatever the device
// calls returned, so a device failure on one rank cannot leave the other
// waiting in a barrier. They run on a dup: device calls take collective
// numbers as host calls do, and only rank 0 makes the later device calls
// (a dead rank calls nothing).
TEST_F(FakeDeviceMeshTest, AsyncErrorFailsPendingWorkAndAbortsTheCommunicator) {
  auto outcomes = run(2, [](Communicator& c) {
    auto buf = on_device<float>({1, 2}, DType::kFloat32, gpu(c.rank()));
    if (!buf.ok()) return fail(buf.status());
    auto host = c.dup();
    if (!host.ok()) return fail(host.status());
    const absl::Status first = c.allreduce(*buf, *buf, ReduceOp::kSum);
    const absl::Status met = host->barrier();
    if (c.rank() == 1) fake_engine().kill_rank(1);
    const absl::Status killed = host->barrier();
    std::vector<double> got;
    if (c.rank() == 0) {
      absl::Status st = c.iallreduce(*buf, *buf, ReduceOp::kSum).wait(absl::Seconds(30)).status();
      got.push_back(st.code() == absl::StatusCode::kUnavailable ? 1 : 0);
      got.push_back(std::string(st.message()).find("peer died") != std::string::npos ? 1 : 0);
      st = c.allreduce(*buf, *buf, ReduceOp::kSum);
      got.push_back(st.code() == absl::StatusCode::kFailedPrecondition ? 1 : 0);
      got.push_back(std::string(st.message()).find("aborted") != std::string::npos ? 1 : 0);
    }
    int64_t v = c.rank() + 1;
    const absl::Status sum = host->allreduce(TensorView::Contiguous(&v, DType::kInt64, {1}),
                                             TensorView::Contiguous(&v, DType::kInt64, {1}), ReduceOp::kSum);
    for (const absl::Status& st : {first, met, killed, sum}) {
      if (!st.ok()) return fail(st);
    }
    got.push_back(double(v));
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  EXPECT_EQ(outcomes[0].values, (std::vector<double>{1, 1, 1, 1, 3}));
  EXPECT_EQ(outcomes[1].values, (std::vector<double>{3}));
}

// A peer that never joins the collective: past the deadline the watchdog
// fails every pending request of the communicator and aborts it; no hang.
// (The peer calls nothing on the communicator; the barrier after is on a dup.)
TEST_F(FakeDeviceMeshTest, HungPeerHitsTheDeadline) {
  auto outcomes = run(2, [](Communicator& c) {
    auto buf = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!buf.ok()) return fail(buf.status());
    auto host = c.dup();
    if (!host.ok()) return fail(host.status());
    if (absl::Status st = c.allreduce(*buf, *buf, ReduceOp::kSum); !st.ok()) return fail(st);
    std::vector<double> got;
    if (c.rank() == 0) {
      DeviceOptions short_deadline;
      short_deadline.timeout = absl::Milliseconds(200);
      DeviceOptions long_deadline;
      long_deadline.timeout = absl::Seconds(600);
      Request first = c.iallreduce(*buf, *buf, ReduceOp::kSum, short_deadline);
      Request second = c.ibroadcast(*buf, 0, long_deadline);
      absl::Status st = first.wait(absl::Seconds(30)).status();
      got.push_back(st.code() == absl::StatusCode::kDeadlineExceeded ? 1 : 0);
      got.push_back(std::string(st.message()).find("hung") != std::string::npos ? 1 : 0);
      got.push_back(second.wait(absl::Seconds(30)).status().code() == absl::StatusCode::kDeadlineExceeded ? 1 : 0);
    }
    if (absl::Status st = host->barrier(); !st.ok()) return fail(st);
    got.push_back(1);
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  EXPECT_EQ(outcomes[0].values, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(outcomes[1].values, (std::vector<double>{1}));
}

// Four members on a 2-worker runtime, three rounds of `wait_for_sum`: each
// member allreduces rank + 1 on its GPU, waits its own way, and returns the
// sum it read back (10 on every member).
void crowded_rounds(const std::string& name,
                    const std::function<absl::Status(Communicator&, int round, const TensorView& buf)>& wait_for_sum) {
  fake_engine();
  Runtime runtime(RuntimeOptions{.workers = 2});
  auto mesh = ActorMesh<testing::ScenarioMember<double>>::Spawn(runtime, *Shape::Create({{"gpus", size_t{4}}}),
                                                                MeshOptions{.name = name});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  for (int round = 0; round < 3; ++round) {
    auto values = mesh->call(testing::RunScenario<double>{[round, wait_for_sum](Communicator& c) {
                    auto buf = on_device<float>({float(c.rank() + 1)}, DType::kFloat32, gpu(c.rank()));
                    if (!buf.ok()) return fail(buf.status());
                    if (absl::Status st = wait_for_sum(c, round, *buf); !st.ok()) return fail(st);
                    auto back = to_host<float>(*buf);
                    if (!back.ok()) return fail(back.status());
                    return Outcome{"", *back};
                  }})
                      .get(absl::Seconds(60));
    ASSERT_TRUE(values.ok()) << values.status();
    for (const Outcome& o : values->values()) {
      EXPECT_EQ(o.error, "") << "round " << round;
      EXPECT_EQ(o.values, std::vector<double>{10}) << "round " << round;
    }
  }
  mesh->stop();
}

// More members than workers, each waiting on its own device work: a wait
// that outlasts its spin hands the member's worker on (BlockingScope), so
// the members still queued behind it run and enqueue their part. The first
// round builds the device communicator (its id exchange and the collective
// init block too); the later rounds block only in the wait on the work.
// Without the hand-over the waits of the first two members hold both
// workers until their deadline.
TEST(FakeDeviceCrowded, MoreWaitingMembersThanWorkersComplete) {
  crowded_rounds("crowded-gpus", [](Communicator& c, int, const TensorView& buf) {
    return c.iallreduce(buf, buf, ReduceOp::kSum).wait(absl::Seconds(20)).status();
  });
}

// The same crowd waiting on its own stream (DeviceStream::synchronize, or
// an event recorded after the collective): the backend call blocks until
// every member enqueued its part, so the members still queued must get a
// worker meanwhile. Without the hand-over it hangs.
TEST(FakeDeviceCrowded, MembersSynchronizingTheirStreamsComplete) {
  crowded_rounds("crowded-streams", [](Communicator& c, int round, const TensorView& buf) {
    auto stream = DeviceStream::Create(gpu(c.rank()));
    if (!stream.ok()) return stream.status();
    Request work = c.iallreduce(buf, buf, ReduceOp::kSum, DeviceOptions{.stream = *stream});
    if (round == 1) {
      auto event = DeviceEvent::Create(gpu(c.rank()));
      if (!event.ok()) return event.status();
      if (absl::Status st = event->record(*stream); !st.ok()) return st;
      if (absl::Status st = event->synchronize(); !st.ok()) return st;
    } else if (absl::Status st = stream->synchronize(); !st.ok()) {
      return st;
    }
    return work.wait(absl::Seconds(20)).status();
  });
}

// What NCCL cannot do is a clear Unimplemented saying to stage to host;
// bad arguments are clear errors on every rank; the communicator goes on.
TEST_F(FakeDeviceMeshTest, UnsupportedOpsAndBadArgumentsAreClearErrors) {
  auto outcomes = run(2, [](Communicator& c) {
    const Device d = gpu(c.rank());
    auto buf = on_device<int32_t>({1, 2}, DType::kInt32, d);
    auto other = on_device<int32_t>({1, 2}, DType::kInt32, gpu(3 - c.rank()));
    if (!buf.ok() || !other.ok()) return fail(absl::InternalError("setup"));
    std::vector<double> got;
    auto is = [&](const absl::Status& st, absl::StatusCode code, const char* text) {
      got.push_back(st.code() == code && std::string(st.message()).find(text) != std::string::npos ? 1 : 0);
    };
    // First call refused on rank 1 only: every rank learns it (no hang);
    // rank 0 hears it from rank 1.
    is(c.allreduce(*buf, c.rank() == 1 ? *other : *buf, ReduceOp::kSum), absl::StatusCode::kInvalidArgument,
       c.rank() == 0 ? "rank 1 refused its arguments: output is on cuda:2" : "output is on cuda:2");
    is(c.allreduce(*buf, *buf, ReduceOp::kBand), absl::StatusCode::kUnimplemented, "host");
    is(c.allreduce(*buf, *buf, CustomReduceOp{"mine", [](const void*, void*, size_t, DType) {}, true}),
       absl::StatusCode::kUnimplemented, "user-defined");
    is(c.allreduce(*buf, *buf, ReduceOp::kAvg), absl::StatusCode::kInvalidArgument, "avg");
    is(c.send(*buf, 1 - c.rank()), absl::StatusCode::kUnimplemented, "host memory only");
    is(c.irecv(*buf, 1 - c.rank()).wait().status(), absl::StatusCode::kUnimplemented, "host memory only");
    auto wrong = DeviceStream::Create(gpu(3 - c.rank()));
    if (!wrong.ok()) return fail(wrong.status());
    is(c.allreduce(*buf, *buf, ReduceOp::kSum, DeviceOptions{.stream = *wrong}), absl::StatusCode::kInvalidArgument,
       "stream is on");
    int32_t host = 1;
    is(c.allreduce(*buf, TensorView::Contiguous(&host, DType::kInt32, {1}), ReduceOp::kSum),
       absl::StatusCode::kInvalidArgument, "one device");
    // Still usable: a good call on every rank.
    if (absl::Status st = c.allreduce(*buf, *buf, ReduceOp::kSum); !st.ok()) return fail(st);
    auto v = to_host<int32_t>(*buf);
    if (!v.ok()) return fail(v.status());
    got.insert(got.end(), v->begin(), v->end());
    return Outcome{"", got};
  });
  ASSERT_NO_FATAL_FAILURE(expect_ok(outcomes, 2));
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{1, 1, 1, 1, 1, 1, 1, 1, 2, 4}));
}

}  // namespace
}  // namespace castmesh
