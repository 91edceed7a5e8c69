// The tensor_engine logic (te_engine.c) against FakeCuda / FakeNccl: stream
// ordering, events across streams, collectives across in-process ranks,
// group fusion, the dead-peer -> async error -> abort path, and a missing
// collective library through the real dlopen path.
#include "te_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fake_cuda.h"

namespace castmesh {
namespace {

using ::castmesh::fakes::FakeCuda;
using ::castmesh::fakes::FakeNccl;
using ::testing::HasSubstr;

// An engine over the fakes (or, with nccl_loader, another collective library,
// tried under each of `libraries` in turn, with `hint` as the install hint).
class Engine {
 public:
  explicit Engine(te_nccl_loader loader = &FakeNccl::load, std::vector<const char*> libraries = {TE_NCCL_LIBRARY},
                  const char* hint = TE_NCCL_INSTALL_HINT)
      : libraries_(std::move(libraries)) {
    libraries_.push_back(nullptr);
    engine_.runtime = FakeCuda::ops();
    engine_.load_nccl = loader;
    engine_.nccl_libraries = libraries_.data();
    engine_.nccl_hint = hint;
    te_engine_init(&engine_);
  }
  te_engine* get() { return &engine_; }

 private:
  std::vector<const char*> libraries_;
  te_engine engine_{};
};

#define EXPECT_TE_OK(call)                                  \
  do {                                                      \
    castmesh_error_v1 te_error_{};                          \
    te_error_.message[0] = '\0';                            \
    const int32_t te_status_ = (call);                      \
    EXPECT_EQ(te_status_, CASTMESH_STATUS_OK) << te_error_.message; \
  } while (0)
#define ERR (&te_error_)

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void run_ranks(int nranks, Fn fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

// One rank's stream, communicator and a device buffer of `count` T.
template <typename T>
struct Rank {
  Rank(te_engine* e, const castmesh_te_unique_id_v1& id, int nranks, int rank, size_t count) : e(e) {
    EXPECT_TE_OK(te_stream_create(e, rank % 4, &stream, ERR));
    EXPECT_TE_OK(te_comm_create(e, rank % 4, &id, nranks, rank, &comm, ERR));
    EXPECT_TE_OK(te_device_alloc(e, rank % 4, count * sizeof(T) * nranks, &device, ERR));
    EXPECT_TE_OK(te_device_alloc(e, rank % 4, count * sizeof(T) * nranks, &out, ERR));
  }
  ~Rank() {
    EXPECT_TE_OK(te_comm_destroy(e, comm, ERR));
    EXPECT_TE_OK(te_device_free(e, device, ERR));
    EXPECT_TE_OK(te_device_free(e, out, ERR));
    EXPECT_TE_OK(te_stream_destroy(e, stream, ERR));
  }
  void upload(const std::vector<T>& values) {
    EXPECT_TE_OK(te_copy(e, device, values.data(), values.size() * sizeof(T), CASTMESH_TE_COPY_HOST_TO_DEVICE,
                         stream, ERR));
  }
  std::vector<T> download(size_t count) {
    std::vector<T> values(count);
    EXPECT_TE_OK(te_copy(e, values.data(), out, count * sizeof(T), CASTMESH_TE_COPY_DEVICE_TO_HOST, stream, ERR));
    EXPECT_TE_OK(te_stream_synchronize(e, stream, ERR));
    return values;
  }
  te_engine* e;
  castmesh_te_stream_v1* stream = nullptr;
  castmesh_te_comm_v1* comm = nullptr;
  void* device = nullptr;
  void* out = nullptr;
};

castmesh_te_unique_id_v1 new_id(te_engine* e) {
  castmesh_te_unique_id_v1 id{};
  EXPECT_TE_OK(te_comm_unique_id(e, &id, ERR));
  return id;
}

TEST(FakeTensorEngine, DeviceMemoryErrorsSayWhatToFix) {
  Engine engine;
  const int64_t before = FakeCuda::live_device_allocations();
  void* ptr = nullptr;
  EXPECT_TE_OK(te_device_alloc(engine.get(), 1, 256, &ptr, ERR));
  EXPECT_NE(ptr, nullptr);
  EXPECT_EQ(FakeCuda::live_device_allocations(), before + 1);
  EXPECT_TE_OK(te_device_free(engine.get(), ptr, ERR));
  EXPECT_EQ(FakeCuda::live_device_allocations(), before);

  castmesh_error_v1 error{};
  EXPECT_EQ(te_device_free(engine.get(), ptr, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("FakeCUDA device free failed: invalid argument"));
  EXPECT_EQ(te_device_alloc(engine.get(), 9, 256, &ptr, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("pass a device index that query_devices reported"));
  EXPECT_EQ(te_device_alloc(engine.get(), 0, uint64_t{1} << 40, &ptr, &error), CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(error.message, HasSubstr("free device memory"));
  EXPECT_EQ(te_device_alloc(engine.get(), -1, 8, &ptr, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  void* pinned = nullptr;
  EXPECT_TE_OK(te_pinned_alloc(engine.get(), 64, &pinned, ERR));
  EXPECT_TE_OK(te_pinned_free(engine.get(), pinned, ERR));
  EXPECT_TE_OK(te_device_free(engine.get(), nullptr, ERR));
}

TEST(FakeTensorEngine, UnknownHandlesAndBadCopyKindsAreClearErrors) {
  Engine engine;
  castmesh_error_v1 error{};
  int32_t done = 0;
  EXPECT_EQ(te_stream_query(engine.get(), nullptr, &done, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("unknown stream handle"));
  castmesh_te_event_v1* event = nullptr;
  EXPECT_TE_OK(te_event_create(engine.get(), 0, &event, ERR));
  // An event handle where a stream belongs is caught by the handle's tag.
  EXPECT_EQ(te_stream_synchronize(engine.get(), reinterpret_cast<castmesh_te_stream_v1*>(event), &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  castmesh_te_stream_v1* stream = nullptr;
  EXPECT_TE_OK(te_stream_create(engine.get(), 1, &stream, ERR));
  char a = 1, b = 0;
  EXPECT_EQ(te_copy(engine.get(), &b, &a, 1, 7, stream, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("CASTMESH_TE_COPY_HOST_TO_DEVICE"));
  EXPECT_EQ(te_event_record(engine.get(), event, stream, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("create the event on the stream's device"));
  EXPECT_TE_OK(te_event_destroy(engine.get(), event, ERR));
  EXPECT_TE_OK(te_stream_destroy(engine.get(), stream, ERR));
}

TEST(FakeTensorEngine, ACopyEnqueuedAfterAKernelSeesItsResult) {
  Engine engine;
  castmesh_te_stream_v1* stream = nullptr;
  EXPECT_TE_OK(te_stream_create(engine.get(), 0, &stream, ERR));
  void* native = FakeCuda::last_stream_created();
  void* device = nullptr;
  EXPECT_TE_OK(te_device_alloc(engine.get(), 0, sizeof(int32_t), &device, ERR));
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  FakeCuda::launch(native, [opened, device] {
    opened.wait();
    *static_cast<int32_t*>(device) = 42;
  });
  int32_t host = 0;
  EXPECT_TE_OK(te_copy(engine.get(), &host, device, sizeof host, CASTMESH_TE_COPY_DEVICE_TO_HOST, stream, ERR));
  int32_t done = 1;
  EXPECT_TE_OK(te_stream_query(engine.get(), stream, &done, ERR));
  EXPECT_EQ(done, 0);  // the kernel is held at the gate
  gate.set_value();
  EXPECT_TE_OK(te_stream_synchronize(engine.get(), stream, ERR));
  EXPECT_EQ(host, 42);
  EXPECT_TE_OK(te_stream_query(engine.get(), stream, &done, ERR));
  EXPECT_EQ(done, 1);
  EXPECT_TE_OK(te_device_free(engine.get(), device, ERR));
  EXPECT_TE_OK(te_stream_destroy(engine.get(), stream, ERR));
}

TEST(FakeTensorEngine, AStreamWaitingOnAnEventRunsAfterTheOtherStreamsWork) {
  Engine engine;
  castmesh_te_stream_v1* producer = nullptr;
  castmesh_te_stream_v1* consumer = nullptr;
  castmesh_te_event_v1* event = nullptr;
  EXPECT_TE_OK(te_stream_create(engine.get(), 2, &producer, ERR));
  void* producer_native = FakeCuda::last_stream_created();
  EXPECT_TE_OK(te_stream_create(engine.get(), 2, &consumer, ERR));
  EXPECT_TE_OK(te_event_create(engine.get(), 2, &event, ERR));
  void* device = nullptr;
  EXPECT_TE_OK(te_device_alloc(engine.get(), 2, sizeof(double), &device, ERR));

  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  FakeCuda::launch(producer_native, [opened, device] {
    opened.wait();
    *static_cast<double*>(device) = 2.5;
  });
  EXPECT_TE_OK(te_event_record(engine.get(), event, producer, ERR));
  EXPECT_TE_OK(te_stream_wait_event(engine.get(), consumer, event, ERR));
  double host = 0;
  EXPECT_TE_OK(te_copy(engine.get(), &host, device, sizeof host, CASTMESH_TE_COPY_DEVICE_TO_HOST, consumer, ERR));

  int32_t done = 1;
  EXPECT_TE_OK(te_event_query(engine.get(), event, &done, ERR));
  EXPECT_EQ(done, 0);
  EXPECT_TE_OK(te_stream_query(engine.get(), consumer, &done, ERR));
  EXPECT_EQ(done, 0);  // held behind the producer's event
  gate.set_value();
  EXPECT_TE_OK(te_stream_synchronize(engine.get(), consumer, ERR));
  EXPECT_EQ(host, 2.5);
  EXPECT_TE_OK(te_event_synchronize(engine.get(), event, ERR));
  EXPECT_TE_OK(te_event_query(engine.get(), event, &done, ERR));
  EXPECT_EQ(done, 1);

  EXPECT_TE_OK(te_device_free(engine.get(), device, ERR));
  EXPECT_TE_OK(te_event_destroy(engine.get(), event, ERR));
  EXPECT_TE_OK(te_stream_destroy(engine.get(), producer, ERR));
  EXPECT_TE_OK(te_stream_destroy(engine.get(), consumer, ERR));
}

class FakeRanks : public ::testing::TestWithParam<int> {};

TEST_P(FakeRanks, AllreduceSumsAndMaxesAcrossRanks) {
  const int nranks = GetParam();
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(nranks, [&](int rank) {
    Rank<float> r(engine.get(), id, nranks, rank, 3);
    r.upload({1.0f * rank, 2.0f, 10.0f * (rank + 1)});
    EXPECT_TE_OK(te_allreduce(engine.get(), r.comm, r.device, r.out, 3, CASTMESH_TE_DTYPE_FLOAT32,
                              CASTMESH_TE_REDUCE_SUM, r.stream, ERR));
    const float ranks_sum = nranks * (nranks - 1) / 2.0f;
    EXPECT_EQ(r.download(3), (std::vector<float>{ranks_sum, 2.0f * nranks, 10.0f * (ranks_sum + nranks)}));
    // In place, MAX.
    EXPECT_TE_OK(te_allreduce(engine.get(), r.comm, r.out, r.out, 3, CASTMESH_TE_DTYPE_FLOAT32,
                              CASTMESH_TE_REDUCE_MAX, r.stream, ERR));
    EXPECT_EQ(r.download(3), (std::vector<float>{ranks_sum, 2.0f * nranks, 10.0f * (ranks_sum + nranks)}));
  });
}

TEST_P(FakeRanks, BroadcastFromTheLastRankAndAllgatherInRankOrder) {
  const int nranks = GetParam();
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(nranks, [&](int rank) {
    Rank<int64_t> r(engine.get(), id, nranks, rank, 2);
    r.upload({100 + rank, -rank});
    EXPECT_TE_OK(te_broadcast(engine.get(), r.comm, r.device, r.out, 2, CASTMESH_TE_DTYPE_INT64, nranks - 1,
                              r.stream, ERR));
    EXPECT_EQ(r.download(2), (std::vector<int64_t>{100 + nranks - 1, -(nranks - 1)}));
    EXPECT_TE_OK(te_allgather(engine.get(), r.comm, r.device, r.out, 2, CASTMESH_TE_DTYPE_INT64, r.stream, ERR));
    std::vector<int64_t> expected;
    for (int k = 0; k < nranks; ++k) expected.insert(expected.end(), {100 + k, -k});
    EXPECT_EQ(r.download(2 * nranks), expected);
  });
}

TEST_P(FakeRanks, ReduceScatterGivesEachRankItsReducedBlock) {
  const int nranks = GetParam();
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(nranks, [&](int rank) {
    Rank<int32_t> r(engine.get(), id, nranks, rank, 1);
    std::vector<int32_t> mine(nranks);
    for (int k = 0; k < nranks; ++k) mine[k] = (rank + 1) * (k + 1);  // block k of rank `rank`
    r.upload(mine);
    EXPECT_TE_OK(te_reduce_scatter(engine.get(), r.comm, r.device, r.out, 1, CASTMESH_TE_DTYPE_INT32,
                                   CASTMESH_TE_REDUCE_SUM, r.stream, ERR));
    EXPECT_EQ(r.download(1), (std::vector<int32_t>{(rank + 1) * nranks * (nranks + 1) / 2}));
  });
}

INSTANTIATE_TEST_SUITE_P(TwoToFour, FakeRanks, ::testing::Values(2, 3, 4));

TEST(FakeTensorEngine, SendAndRecvInOneGroupExchangeAroundARing) {
  const int nranks = 3;
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(nranks, [&](int rank) {
    Rank<uint64_t> r(engine.get(), id, nranks, rank, 4);
    r.upload({uint64_t(rank), 7, 8, 9});
    // Every rank sends before it receives: without the group the fake (like
    // NCCL) would block each send until its peer's recv runs.
    EXPECT_TE_OK(te_group_begin(engine.get(), ERR));
    EXPECT_TE_OK(te_send(engine.get(), r.comm, r.device, 4, CASTMESH_TE_DTYPE_UINT64, (rank + 1) % nranks,
                         r.stream, ERR));
    EXPECT_TE_OK(te_recv(engine.get(), r.comm, r.out, 4, CASTMESH_TE_DTYPE_UINT64, (rank + nranks - 1) % nranks,
                         r.stream, ERR));
    EXPECT_TE_OK(te_group_end(engine.get(), ERR));
    EXPECT_EQ(r.download(4), (std::vector<uint64_t>{uint64_t((rank + nranks - 1) % nranks), 7, 8, 9}));
  });
}

TEST(FakeTensorEngine, BadCollectiveArgumentsAreRejectedBeforeEnqueueing) {
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(2, [&](int rank) {
    Rank<float> r(engine.get(), id, 2, rank, 1);
    castmesh_error_v1 error{};
    EXPECT_EQ(te_allreduce(engine.get(), r.comm, r.device, r.out, 1, 99, CASTMESH_TE_REDUCE_SUM, r.stream, &error),
              CASTMESH_STATUS_INVALID_ARGUMENT);
    EXPECT_THAT(error.message, HasSubstr("not a castmesh_te_dtype_v1"));
    EXPECT_EQ(te_allreduce(engine.get(), r.comm, r.device, r.out, 1, CASTMESH_TE_DTYPE_FLOAT32, 42, r.stream,
                           &error),
              CASTMESH_STATUS_INVALID_ARGUMENT);
    EXPECT_THAT(error.message, HasSubstr("stage to host"));
    EXPECT_EQ(te_send(engine.get(), r.comm, r.device, 1, CASTMESH_TE_DTYPE_FLOAT32, rank, r.stream, &error),
              CASTMESH_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(te_broadcast(engine.get(), r.comm, r.device, r.out, 1, CASTMESH_TE_DTYPE_FLOAT32, 2, r.stream,
                           &error),
              CASTMESH_STATUS_INVALID_ARGUMENT);
  });
}

TEST(FakeTensorEngine, ALibraryErrorAtEnqueueCarriesTheLibrarysOwnExplanation) {
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  run_ranks(2, [&](int rank) {
    Rank<uint16_t> r(engine.get(), id, 2, rank, 1);
    castmesh_error_v1 error{};
    // A valid castmesh dtype the fake NCCL does not implement: its refusal
    // (ncclInvalidArgument + ncclGetLastError's text) reaches the caller.
    EXPECT_EQ(te_allreduce(engine.get(), r.comm, r.device, r.out, 1, CASTMESH_TE_DTYPE_FLOAT16,
                           CASTMESH_TE_REDUCE_SUM, r.stream, &error),
              CASTMESH_STATUS_INVALID_ARGUMENT);
    EXPECT_THAT(error.message, HasSubstr("ncclAllReduce failed: invalid argument"));
    EXPECT_THAT(error.message, HasSubstr("the fake NCCL has no float16/bfloat16"));
  });
}

TEST(FakeTensorEngine, ADeadPeerIsReportedAsAnAsyncErrorAndAbortEndsThePendingCollective) {
  Engine engine;
  const castmesh_te_unique_id_v1 id = new_id(engine.get());
  castmesh_te_comm_v1* survivor = nullptr;
  castmesh_te_stream_v1* stream = nullptr;
  EXPECT_TE_OK(te_stream_create(engine.get(), 0, &stream, ERR));
  castmesh_te_comm_v1* dead = nullptr;
  std::thread peer([&] {
    EXPECT_TE_OK(te_comm_create(engine.get(), 1, &id, 2, 1, &dead, ERR));
    // Rank 1 then "dies": it never joins the allreduce.
  });
  EXPECT_TE_OK(te_comm_create(engine.get(), 0, &id, 2, 0, &survivor, ERR));
  peer.join();
  float value = 1, result = 0;
  EXPECT_TE_OK(te_allreduce(engine.get(), survivor, &value, &result, 1, CASTMESH_TE_DTYPE_FLOAT32,
                            CASTMESH_TE_REDUCE_SUM, stream, ERR));
  int32_t done = 1;
  EXPECT_TE_OK(te_stream_query(engine.get(), stream, &done, ERR));
  EXPECT_EQ(done, 0);  // waiting for rank 1
  EXPECT_TE_OK(te_comm_async_error(engine.get(), survivor, ERR));

  FakeNccl::kill_rank(id, 1);
  castmesh_error_v1 error{};
  EXPECT_EQ(te_comm_async_error(engine.get(), survivor, &error), CASTMESH_STATUS_UNAVAILABLE);
  EXPECT_THAT(error.message, HasSubstr("remote process exited"));
  EXPECT_THAT(error.message, HasSubstr("abort the communicator"));

  EXPECT_TE_OK(te_comm_abort(engine.get(), survivor, ERR));
  EXPECT_TE_OK(te_stream_synchronize(engine.get(), stream, ERR));  // no longer blocked
  EXPECT_EQ(result, 0);  // never computed
  EXPECT_TE_OK(te_stream_destroy(engine.get(), stream, ERR));
  EXPECT_TE_OK(te_comm_abort(engine.get(), dead, ERR));  // what the dead process would have released
}

TEST(TensorEngineNcclDlopen, AMissingLibraryLeavesMemoryAndStreamsWorkingAndCollectivesSayWhatToInstall) {
  Engine engine(&te_nccl_dlopen, {"libcastmesh-test-no-such-nccl.so.2"});
  castmesh_error_v1 error{};
  castmesh_te_unique_id_v1 id{};
  EXPECT_EQ(te_comm_unique_id(engine.get(), &id, &error), CASTMESH_STATUS_NO_DRIVER);
  EXPECT_THAT(error.message, HasSubstr("device collectives need NCCL: pip install nvidia-nccl-cu13 (or -cu12)"));
  EXPECT_THAT(error.message, HasSubstr("libcastmesh-test-no-such-nccl.so.2"));
  EXPECT_EQ(te_group_begin(engine.get(), &error), CASTMESH_STATUS_NO_DRIVER);

  castmesh_te_stream_v1* stream = nullptr;
  EXPECT_TE_OK(te_stream_create(engine.get(), 0, &stream, ERR));
  void* device = nullptr;
  EXPECT_TE_OK(te_device_alloc(engine.get(), 0, 4, &device, ERR));
  const int32_t in = 7;
  int32_t back = 0;
  EXPECT_TE_OK(te_copy(engine.get(), device, &in, 4, CASTMESH_TE_COPY_HOST_TO_DEVICE, stream, ERR));
  EXPECT_TE_OK(te_copy(engine.get(), &back, device, 4, CASTMESH_TE_COPY_DEVICE_TO_HOST, stream, ERR));
  EXPECT_TE_OK(te_stream_synchronize(engine.get(), stream, ERR));
  EXPECT_EQ(back, 7);
  EXPECT_TE_OK(te_device_free(engine.get(), device, ERR));
  EXPECT_TE_OK(te_stream_destroy(engine.get(), stream, ERR));
}

// The HIP build's collective library: RCCL under its soname, then its link.
TEST(TensorEngineNcclDlopen, EveryRcclNameIsTriedAndTheErrorNamesEachAndWhatToInstall) {
  Engine engine(&te_nccl_dlopen, {"libcastmesh-test-no-rccl.so.1", "libcastmesh-test-no-rccl.so"},
                TE_RCCL_INSTALL_HINT);
  castmesh_error_v1 error{};
  castmesh_te_unique_id_v1 id{};
  EXPECT_EQ(te_comm_unique_id(engine.get(), &id, &error), CASTMESH_STATUS_NO_DRIVER);
  EXPECT_THAT(error.message, HasSubstr("device collectives need RCCL: install ROCm's rccl package"));
  EXPECT_THAT(error.message, HasSubstr("libcastmesh-test-no-rccl.so.1: cannot open shared object file"));
  EXPECT_THAT(error.message, HasSubstr("; libcastmesh-test-no-rccl.so: cannot open shared object file"));
  EXPECT_THAT(error.message, HasSubstr("memory, streams and copies still work"));
}

// Names a test loader was asked for, in order; it fails all but `kLoadable`.
std::vector<std::string> g_tried;
constexpr const char* kLoadable = "libcastmesh-test-second.so";
int load_only_second(const char* library, te_nccl_ops* ops, char* why, size_t why_size) {
  g_tried.emplace_back(library);
  if (std::string(library) != kLoadable) {
    std::snprintf(why, why_size, "%s: not this one", library);
    return -1;
  }
  return FakeNccl::load(library, ops, why, why_size);
}

TEST(FakeTensorEngine, TheFirstCollectiveLibraryThatLoadsIsUsedAndLoadingIsNotRetried) {
  g_tried.clear();
  Engine engine(&load_only_second, {"libcastmesh-test-first.so.1", kLoadable, "libcastmesh-test-third.so"});
  castmesh_te_unique_id_v1 id{};
  EXPECT_TE_OK(te_comm_unique_id(engine.get(), &id, ERR));
  EXPECT_TE_OK(te_group_begin(engine.get(), ERR));
  EXPECT_TE_OK(te_group_end(engine.get(), ERR));
  EXPECT_THAT(g_tried, ::testing::ElementsAre("libcastmesh-test-first.so.1", kLoadable));
}

TEST(FakeTensorEngine, NoCollectiveLibraryNamesIsAClearNoDriver) {
  Engine engine(&FakeNccl::load, {});
  castmesh_error_v1 error{};
  EXPECT_EQ(te_group_begin(engine.get(), &error), CASTMESH_STATUS_NO_DRIVER);
  EXPECT_THAT(error.message, HasSubstr("no collective library name configured"));
}

TEST(TensorEngineNcclDlopen, ALibraryWithoutNcclSymbolsIsRejectedByName) {
  te_nccl_ops ops{};
  char why[256] = {0};
  // libc is always there and has no ncclGetVersion.
  EXPECT_EQ(te_nccl_dlopen("libc.so.6", &ops, why, sizeof why), -1);
  EXPECT_THAT(why, HasSubstr("has no symbol ncclGetVersion"));
}

}  // namespace
}  // namespace castmesh

namespace castmesh {
namespace {

// stream_wrap / stream_native (the DLPack stream protocol's plugin side): a
// wrapped native stream is that stream, its handle's destroy leaves the
// native stream alone, and the runtime's special values (CUDA's legacy and
// per-thread default streams) can be wrapped.
TEST(TensorEngine, WrappedNativeStreamsAreUsedButNotOwned) {
  Engine engine;
  te_engine* e = engine.get();
  castmesh_te_stream_v1* own = nullptr;
  EXPECT_TE_OK(te_stream_create(e, 1, &own, ERR));
  void* native = nullptr;
  EXPECT_TE_OK(te_stream_native_handle(e, own, &native, ERR));
  ASSERT_NE(native, nullptr);
  castmesh_te_stream_v1* wrapped = nullptr;
  EXPECT_TE_OK(te_stream_wrap(e, 1, native, &wrapped, ERR));
  void* again = nullptr;
  EXPECT_TE_OK(te_stream_native_handle(e, wrapped, &again, ERR));
  EXPECT_EQ(again, native);
  void* dev = nullptr;
  EXPECT_TE_OK(te_device_alloc(e, 1, sizeof(int32_t), &dev, ERR));
  const int32_t value = 42;
  EXPECT_TE_OK(te_copy(e, dev, &value, sizeof value, CASTMESH_TE_COPY_HOST_TO_DEVICE, wrapped, ERR));
  EXPECT_TE_OK(te_stream_destroy(e, wrapped, ERR));  // the handle only
  int32_t back = 0;
  EXPECT_TE_OK(te_copy(e, &back, dev, sizeof back, CASTMESH_TE_COPY_DEVICE_TO_HOST, own, ERR));
  EXPECT_TE_OK(te_stream_synchronize(e, own, ERR));  // the native stream still works: not destroyed
  EXPECT_EQ(back, 42);
  castmesh_te_stream_v1* legacy = nullptr;
  EXPECT_TE_OK(te_stream_wrap(e, 0, reinterpret_cast<void*>(uintptr_t{1}), &legacy, ERR));
  EXPECT_TE_OK(te_stream_synchronize(e, legacy, ERR));
  EXPECT_TE_OK(te_stream_destroy(e, legacy, ERR));
  castmesh_error_v1 error{};
  castmesh_te_stream_v1* bad = nullptr;
  EXPECT_EQ(te_stream_wrap(e, 9, native, &bad, &error), CASTMESH_STATUS_NO_DEVICE) << error.message;
  EXPECT_EQ(te_stream_wrap(e, 0, native, nullptr, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(te_stream_native_handle(e, nullptr, &native, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_TE_OK(te_device_free(e, dev, ERR));
  EXPECT_TE_OK(te_stream_destroy(e, own, ERR));
}

}  // namespace
}  // namespace castmesh
