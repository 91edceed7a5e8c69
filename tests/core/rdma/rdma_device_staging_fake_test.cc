// RdmaBuffer over device memory through host staging, with the FAKE
// tensor_engine plugin (its "device" memory is host memory behind a fake CUDA
// table, its copies run on fake streams): in one process, and across real
// worker procs (this binary re-executed) over the shared segment and the
// socket transport. The owner stages reads and writes of its device memory;
// a requester stages a device destination or source.
//
// On a GPU machine the same tests run against the real CUDA plugin with
// CASTMESH_TEST_REAL_TE_DIR=<its folder> (one device is enough; the copy
// counts are not checked): any CPU access to device memory then crashes.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/castmesh.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/rdma.h"
#include "castmesh/tensor_engine.h"
#include "core/collectives/fake_tensor_engine.h"
#include "core/platform/platform.h"
#include "core/testing/worker_procs.h"
#include "rdma_test_bytes.h"
#include "rdma_test_procs.h"

namespace {

using castmesh::Device;
using castmesh::DeviceKind;
using castmesh::DType;
using castmesh::RdmaAccess;
using castmesh::RdmaBuffer;
using castmesh::RdmaOptions;
using castmesh::RdmaResult;
using castmesh::RdmaTransport;
using castmesh::TensorView;
using castmesh::rdma_test::filled;
using castmesh::rdma_test::mismatch;
using castmesh::rdma_test::Numbers;
using castmesh::rdma_test::ScopedEnv;

// The real plugin's folder (a GPU machine), or "" for the fake plugin.
const char* real_engine_dir() {
  const char* dir = std::getenv("CASTMESH_TEST_REAL_TE_DIR");
  return dir != nullptr && *dir != '\0' ? dir : nullptr;
}

// Loads the tensor_engine plugin this run uses (once per process).
void load_engine() {
  if (const char* dir = real_engine_dir()) {
    static const bool loaded = [dir] {
      ::setenv("CASTMESH_BACKEND_PATH", dir, 1);
      auto devices = castmesh::device_list();
      EXPECT_TRUE(devices.ok()) << devices.status();
      return devices.ok();
    }();
    (void)loaded;
    return;
  }
  castmesh::testing::fake_engine();
}

// Device `i` of the fake (4 devices), or the real machine's first GPU.
Device gpu(int i) { return castmesh::testing::gpu(real_engine_dir() != nullptr ? 0 : i); }

// `size` bytes of pattern(0.., seed) in device memory of `device`.
absl::StatusOr<TensorView> device_filled(size_t size, int seed, Device device) {
  absl::StatusOr<TensorView> t = castmesh::device_empty(DType::kUInt8, {static_cast<int64_t>(size)}, device);
  if (!t.ok()) return t.status();
  absl::StatusOr<castmesh::DeviceStream> s = castmesh::DeviceStream::Create(device);
  if (!s.ok()) return s.status();
  if (absl::Status st = castmesh::device_copy(*t, filled(size, seed), *s); !st.ok()) return st;
  if (absl::Status st = s->synchronize(); !st.ok()) return st;
  return t;
}

// The device tensor's bytes, copied to the host.
std::vector<uint8_t> device_bytes(const TensorView& t) {
  std::vector<uint8_t> host(t.nbytes());
  auto s = castmesh::DeviceStream::Create(t.device());
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok() || host.empty()) return host;
  TensorView h = TensorView::Contiguous(host.data(), DType::kUInt8, {static_cast<int64_t>(host.size())});
  EXPECT_TRUE(castmesh::device_copy(h, t, *s).ok());
  EXPECT_TRUE(s->synchronize().ok());
  return host;
}

// "" when bytes [at, at+length) of device tensor `t` are pattern(offset.., seed).
std::string device_mismatch(const TensorView& t, size_t at, size_t length, size_t offset, int seed) {
  std::vector<uint8_t> host = device_bytes(t);
  return mismatch(host.data() + at, offset, length, seed);
}

bool has(const std::vector<RdmaTransport>& ts, RdmaTransport t) { return std::find(ts.begin(), ts.end(), t) != ts.end(); }

// Owner actor messages: MakeDeviceBuffer {size, access, on_device, seed};
// CheckDeviceBuffer {seed, offset, length} -> "" or the first difference;
// RegisterWithoutBackend {} -> the status of registering CUDA memory in a
// proc whose CASTMESH_BACKEND_PATH names no tensor_engine plugin.
struct MakeDeviceBuffer {
  Numbers n;
};
struct CheckDeviceBuffer {
  Numbers n;
};
struct RegisterWithoutBackend {
  Numbers n;
};
// -> {device-to-host, host-to-device} copies the fake ran in the owner's proc so far.
struct CountCopies {
  Numbers n;
};
absl::Status encode_make(const MakeDeviceBuffer& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_make(std::string_view b, MakeDeviceBuffer* m) { return decode_numbers(b, &m->n); }
absl::Status encode_check(const CheckDeviceBuffer& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_check(std::string_view b, CheckDeviceBuffer* m) { return decode_numbers(b, &m->n); }
absl::Status encode_bare(const RegisterWithoutBackend& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_bare(std::string_view b, RegisterWithoutBackend* m) { return decode_numbers(b, &m->n); }
absl::Status encode_count(const CountCopies& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_count(std::string_view b, CountCopies* m) { return decode_numbers(b, &m->n); }

// Copies of each direction the fake ran in this process so far.
struct Copies {
  int64_t to_host = 0;
  int64_t to_device = 0;
};
Copies copies_here() {
  if (real_engine_dir() != nullptr) return Copies{-1, -1};  // the real driver counts nothing
  const auto& fake = castmesh::testing::fake_engine();
  return Copies{fake.copies(CASTMESH_TE_COPY_DEVICE_TO_HOST), fake.copies(CASTMESH_TE_COPY_HOST_TO_DEVICE)};
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(MakeDeviceBuffer, "castmesh.test.rdma.MakeDeviceBuffer", encode_make, decode_make);
CASTMESH_REGISTER_MESSAGE(CheckDeviceBuffer, "castmesh.test.rdma.CheckDeviceBuffer", encode_check, decode_check);
CASTMESH_REGISTER_MESSAGE(RegisterWithoutBackend, "castmesh.test.rdma.RegisterWithoutBackend", encode_bare,
                          decode_bare);
CASTMESH_REGISTER_MESSAGE(CountCopies, "castmesh.test.rdma.CountCopies", encode_count, decode_count);

namespace {

// Registers a buffer of fake GPU memory (or host memory) filled with pattern(seed).
class DeviceOwner : public castmesh::Actor {
 public:
  absl::StatusOr<RdmaBuffer> make(const MakeDeviceBuffer& m) {
    const auto size = static_cast<size_t>(m.n.values.at(0));
    const int seed = static_cast<int>(m.n.values.at(3));
    if (m.n.values.at(2) != 0) {
      load_engine();
      absl::StatusOr<TensorView> memory = device_filled(size, seed, gpu(0));
      if (!memory.ok()) return memory.status();
      memory_ = *memory;
    } else {
      memory_ = filled(size, seed);
    }
    return RdmaBuffer::register_memory(memory_, static_cast<RdmaAccess>(m.n.values.at(1)));
  }
  std::string check(const CheckDeviceBuffer& m) {
    const auto offset = static_cast<size_t>(m.n.values.at(1));
    const auto length = static_cast<size_t>(m.n.values.at(2));
    const int seed = static_cast<int>(m.n.values.at(0));
    if (memory_.device().kind == DeviceKind::kCuda) return device_mismatch(memory_, offset, length, 0, seed);
    return mismatch(static_cast<char*>(memory_.data()) + offset, 0, length, seed);
  }
  std::string bare(const RegisterWithoutBackend&) {
    static char host[64];
    auto labelled = TensorView::Create(host, DType::kUInt8, {64}, {}, gpu(0));
    if (!labelled.ok()) return labelled.status().ToString();
    return RdmaBuffer::register_memory(*labelled).status().ToString();
  }
  CountCopies count(const CountCopies&) {
    const Copies c = copies_here();
    return CountCopies{{{c.to_host, c.to_device}}};
  }
  using Handlers = castmesh::Handlers<&DeviceOwner::make, &DeviceOwner::check, &DeviceOwner::bare, &DeviceOwner::count>;

 private:
  TensorView memory_;
};

}  // namespace

CASTMESH_REGISTER_ACTOR(DeviceOwner);

namespace {

// ---- one process ----

class RdmaDeviceStagingFake : public ::testing::Test {
 protected:
  RdmaDeviceStagingFake() { load_engine(); }
  castmesh::Runtime runtime_;
};

TEST_F(RdmaDeviceStagingFake, DeviceOwnerInThisProcessReadsAndWritesWithOffsets) {
  auto memory = device_filled(10000, 1, gpu(1));
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto buffer = RdmaBuffer::register_memory(*memory, RdmaAccess::kReadWrite, &runtime_);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->device(), gpu(1));
  EXPECT_FALSE(has(buffer->transports(), RdmaTransport::kSingleCopy));  // a peer cannot process_vm_readv it
  EXPECT_TRUE(has(buffer->transports(), RdmaTransport::kSocket));
  // Into host memory, at an offset.
  TensorView host = TensorView::Allocate(DType::kUInt8, {6000});
  const Copies before = copies_here();
  auto read = buffer->read_into(host, RdmaOptions{.offset = 123, .length = 5000}).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  if (real_engine_dir() == nullptr) {
    EXPECT_GT(copies_here().to_host, before.to_host);  // staged by the backend, not read by the CPU
  }
  EXPECT_TRUE(read->staged);
  EXPECT_EQ(castmesh::rdma_result_transport(*read), "same_process+host_staging");
  EXPECT_EQ(mismatch(host.data(), 123, 5000, 1), "");
  // Into device memory of another device.
  auto dst = device_filled(4000, 9, gpu(2));
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(buffer->read_into(*dst, RdmaOptions{.offset = 6000}).get(absl::Seconds(30)).ok());
  EXPECT_EQ(device_mismatch(*dst, 0, 4000, 6000, 1), "");
  // From device memory, at an offset; the bytes around it are kept.
  auto src = device_filled(3001, 4, gpu(2));
  ASSERT_TRUE(src.ok());
  auto wrote = buffer->write_from(*src, RdmaOptions{.offset = 777}).get(absl::Seconds(30));
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_TRUE(wrote->staged);
  EXPECT_EQ(device_mismatch(*memory, 777, 3001, 0, 4), "");
  EXPECT_EQ(device_mismatch(*memory, 0, 777, 0, 1), "");
  EXPECT_EQ(device_mismatch(*memory, 3778, 10000 - 3778, 3778, 1), "");
  // Bad input still fails before a byte moves.
  EXPECT_EQ(buffer->read_into(*dst, RdmaOptions{.offset = 9000}).get().status().code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(buffer->release().get(absl::Seconds(30)).ok());
  EXPECT_EQ(buffer->read_into(*dst).get().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RdmaDeviceStagingFake, HostOwnerWithADeviceDestinationAndSource) {
  TensorView memory = filled(50000, 1);
  auto buffer = RdmaBuffer::register_memory(memory, RdmaAccess::kReadWrite, &runtime_);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_TRUE(has(buffer->transports(), RdmaTransport::kSingleCopy) ||
              !castmesh::platform::uses_linux_facilities());
  auto dst = device_filled(20000, 9, gpu(0));
  ASSERT_TRUE(dst.ok());
  const Copies before = copies_here();
  auto read = buffer->read_into(*dst, RdmaOptions{.offset = 30000}).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  if (real_engine_dir() == nullptr) {
    EXPECT_GT(copies_here().to_device, before.to_device);
  }
  EXPECT_EQ(castmesh::rdma_result_transport(*read), "same_process+host_staging");
  EXPECT_EQ(device_mismatch(*dst, 0, 20000, 30000, 1), "");
  auto src = device_filled(100, 6, gpu(0));
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(buffer->write_from(*src, RdmaOptions{.offset = 49900}).get(absl::Seconds(30)).ok());
  EXPECT_EQ(mismatch(static_cast<char*>(memory.data()) + 49900, 0, 100, 6), "");
  // A device destination that is too small is refused like a host one.
  EXPECT_EQ(buffer->read_into(*src, RdmaOptions{.length = 101}).get().status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RdmaDeviceStagingFake, TheHandleSaysWhereTheMemoryLives) {
  auto memory = device_filled(100, 1, gpu(3));
  ASSERT_TRUE(memory.ok());
  auto buffer = RdmaBuffer::register_memory(*memory, RdmaAccess::kRead, &runtime_);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto copy = RdmaBuffer::deserialize(buffer->serialize());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->device(), gpu(3));
  EXPECT_EQ(copy->transports(), buffer->transports());
  // A device the backend does not drive is refused with the reason.
  static char host[16];
  auto rocm = TensorView::Create(host, DType::kUInt8, {16}, {}, Device{DeviceKind::kRocm, 0});
  ASSERT_TRUE(rocm.ok());
  auto refused = RdmaBuffer::register_memory(*rocm, RdmaAccess::kRead, &runtime_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
}

// ---- across procs ----

constexpr size_t kChunk = 4096;

// The same-host path a test forces (inherited by the worker procs).
enum class Path { kDefault, kSharedSegment, kSocket };

class RdmaDeviceAcrossProcsFake : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    load_engine();  // device destinations and sources of this proc
    procs_.emplace(2);
    ASSERT_TRUE(procs_->ok());
    auto owners = procs_->procs().spawn<DeviceOwner>("owner");
    ASSERT_TRUE(owners.ok()) << owners.status();
    owners_ = *owners;
  }

  RdmaBuffer make(size_t owner, size_t size, bool on_device, int seed = 1) {
    auto made = owners_.at(owner)
                    .ask(MakeDeviceBuffer{{{static_cast<int64_t>(size), 3, on_device ? 1 : 0, seed}}})
                    .get(absl::Seconds(30));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : RdmaBuffer();
  }
  Copies owner_copies(size_t owner) {
    auto answer = owners_.at(owner).ask(CountCopies{}).get(absl::Seconds(30));
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? Copies{answer->n.values.at(0), answer->n.values.at(1)} : Copies{};
  }
  std::string check(size_t owner, int seed, size_t offset, size_t length) {
    auto answer = owners_.at(owner)
                      .ask(CheckDeviceBuffer{{{seed, static_cast<int64_t>(offset), static_cast<int64_t>(length)}}})
                      .get(absl::Seconds(30));
    return answer.ok() ? *answer : answer.status().ToString();
  }
  // Owner 0 with a 300000-byte device buffer (pattern 1), a device
  // destination of that size (pattern 9), and then owner 0's proc stopped
  // (SIGSTOP, every thread); nullopt (a test failure already) if that failed.
  struct StoppedOwner {
    RdmaBuffer buffer;
    TensorView dst;
    int64_t pid = 0;
  };
  std::optional<StoppedOwner> stopped_owner_with_a_device_buffer() {
    StoppedOwner stopped{make(0, 300000, true), {}, procs_->procs().proc(0).pid};
    auto dst = device_filled(300000, 9, gpu(0));
    EXPECT_TRUE(dst.ok()) << dst.status();
    if (!dst.ok()) return std::nullopt;
    stopped.dst = *dst;
    castmesh::rdma_test::stop_process(stopped.pid);
    if (HasFatalFailure()) return std::nullopt;
    return stopped;
  }
  // The transport of an operation of `size` bytes on a buffer of device (or host) memory.
  RdmaTransport expected(size_t size, bool owner_on_device) const {
    if (GetParam() == Path::kSocket) return RdmaTransport::kSocket;
    if (GetParam() == Path::kDefault && !owner_on_device && castmesh::platform::uses_linux_facilities()) {
      return RdmaTransport::kSingleCopy;  // one-sided, at any size
    }
    return size >= 64 * 1024 ? RdmaTransport::kSharedSegment : RdmaTransport::kSocket;
  }

  ScopedEnv chunk_{"CASTMESH_RDMA_CHUNK_BYTES", "4096"};
  ScopedEnv single_copy_{"CASTMESH_RDMA_SINGLE_COPY", GetParam() == Path::kDefault ? "1" : "0"};
  ScopedEnv shared_segment_{"CASTMESH_RDMA_SHARED_SEGMENT", GetParam() == Path::kSocket ? "0" : "1"};
  std::optional<castmesh::testing::WorkerProcs> procs_;
  std::vector<castmesh::ActorRef<DeviceOwner>> owners_;
};

TEST_P(RdmaDeviceAcrossProcsFake, DeviceOwnerSizesAroundTheStagingChunkBothWays) {
  for (size_t size : {size_t{1}, kChunk - 1, kChunk, kChunk + 1, size_t{300000}, (size_t{8} << 20) + 3}) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    RdmaBuffer buffer = make(0, size, /*on_device=*/true);
    ASSERT_TRUE(buffer.valid());
    EXPECT_EQ(buffer.device(), gpu(0));
    TensorView host = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
    const Copies before = owner_copies(0);
    auto read = buffer.read_into(host).get(absl::Seconds(60));
    ASSERT_TRUE(read.ok()) << read.status();
    // The owner staged the range chunk by chunk (socket chunks and segment slots are 4 KiB).
    const auto chunks = static_cast<int64_t>((size + kChunk - 1) / kChunk);
    if (real_engine_dir() == nullptr) {
      EXPECT_EQ(owner_copies(0).to_host - before.to_host, chunks);
    }
    EXPECT_EQ(read->transport, expected(size, true));
    EXPECT_TRUE(read->staged);
    ASSERT_EQ(mismatch(host.data(), 0, size, 1), "");
    auto dst = device_filled(size, 9, gpu(1));
    ASSERT_TRUE(dst.ok()) << dst.status();
    ASSERT_TRUE(buffer.read_into(*dst).get(absl::Seconds(60)).ok());
    ASSERT_EQ(device_mismatch(*dst, 0, size, 0, 1), "");
    auto src = device_filled(size, 2, gpu(1));
    ASSERT_TRUE(src.ok());
    const Copies before_write = owner_copies(0);
    auto wrote = buffer.write_from(*src).get(absl::Seconds(60));
    ASSERT_TRUE(wrote.ok()) << wrote.status();
    if (real_engine_dir() == nullptr) {
      EXPECT_EQ(owner_copies(0).to_device - before_write.to_device, chunks);
    }
    EXPECT_EQ(castmesh::rdma_result_transport(*wrote),
              std::string(castmesh::rdma_transport_name(expected(size, true))) + "+host_staging");
    EXPECT_EQ(check(0, 2, 0, size), "");
    ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  }
}

TEST_P(RdmaDeviceAcrossProcsFake, DeviceOwnerOffsetsAndLengths) {
  RdmaBuffer buffer = make(0, 200000, true);
  auto dst = device_filled(150000, 9, gpu(0));
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(buffer.read_into(*dst, RdmaOptions{.offset = 12345, .length = 100001}).get(absl::Seconds(30)).ok());
  EXPECT_EQ(device_mismatch(*dst, 0, 100001, 12345, 1), "");
  EXPECT_EQ(device_mismatch(*dst, 100001, 49999, 100001, 9), "");  // past the length: untouched
  TensorView src = filled(70001, 5);
  ASSERT_TRUE(buffer.write_from(src, RdmaOptions{.offset = 129999}).get(absl::Seconds(30)).ok());
  EXPECT_EQ(check(0, 5, 129999, 70001), "");
  EXPECT_EQ(buffer.read_into(*dst, RdmaOptions{.offset = 199999, .length = 2}).get().status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST_P(RdmaDeviceAcrossProcsFake, HostOwnerWithADeviceDestinationAndSource) {
  for (size_t size : {size_t{5000}, size_t{300000}}) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    RdmaBuffer buffer = make(1, size, /*on_device=*/false);
    auto dst = device_filled(size, 9, gpu(2));
    ASSERT_TRUE(dst.ok());
    auto read = buffer.read_into(*dst).get(absl::Seconds(30));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(castmesh::rdma_result_transport(*read),
              std::string(castmesh::rdma_transport_name(expected(size, false))) + "+host_staging");
    EXPECT_EQ(device_mismatch(*dst, 0, size, 0, 1), "");
    auto src = device_filled(size, 3, gpu(2));
    ASSERT_TRUE(src.ok());
    ASSERT_TRUE(buffer.write_from(*src).get(absl::Seconds(30)).ok());
    EXPECT_EQ(check(1, 3, 0, size), "");
  }
}

// A release from a requester while the owner still stages a long read: the
// read finishes with its bytes, and the release resolves behind it.
TEST_P(RdmaDeviceAcrossProcsFake, ReleaseDuringAStagedReadLetsItFinish) {
  constexpr size_t kSize = (size_t{16} << 20) + 3;
  RdmaBuffer buffer = make(0, kSize, true);
  auto dst = device_filled(kSize, 9, gpu(0));
  ASSERT_TRUE(dst.ok());
  castmesh::Future<RdmaResult> read = buffer.read_into(*dst);
  castmesh::Future<castmesh::Unit> released = buffer.release();
  ASSERT_TRUE(released.get(absl::Seconds(60)).ok());
  auto done = read.get(absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(device_mismatch(*dst, 0, kSize, 0, 1), "");
  EXPECT_EQ(buffer.read_into(*dst).get(absl::Seconds(30)).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(RdmaDeviceAcrossProcsFake, StoppedOwnerTimesOutAndNoLateByteLandsInDeviceMemory) {
  std::optional<StoppedOwner> owner = stopped_owner_with_a_device_buffer();
  ASSERT_TRUE(owner.has_value());
  auto& [buffer, dst, pid] = *owner;
  auto read = buffer.read_into(dst, RdmaOptions{.timeout = absl::Milliseconds(500)}).get(absl::Seconds(30));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded) << read.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGCONT), 0);
  EXPECT_EQ(check(0, 1, 0, 0), "");  // a round trip behind the owner's late answer
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(device_mismatch(dst, 0, 300000, 0, 9), "");
  auto again = buffer.read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(device_mismatch(dst, 0, 300000, 0, 1), "");
}

// Pending operations fail within 2 s of the owner's death (its connection's end of file).
TEST_P(RdmaDeviceAcrossProcsFake, KilledDeviceOwnerFailsPendingOperationsQuickly) {
  std::optional<StoppedOwner> owner = stopped_owner_with_a_device_buffer();
  ASSERT_TRUE(owner.has_value());
  auto& [buffer, dst, pid] = *owner;
  castmesh::Future<RdmaResult> pending = buffer.read_into(dst, RdmaOptions{.timeout = absl::Seconds(60)});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const absl::Time killed = absl::Now();
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  auto result = pending.get(absl::Seconds(30));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));
  EXPECT_EQ(device_mismatch(dst, 0, 300000, 0, 9), "");
}

// A device buffer never takes ibverbs, so forbidding the fallback refuses it, before any byte moves.
TEST_P(RdmaDeviceAcrossProcsFake, ForbiddenFallbackRefusesADeviceBuffer) {
  RdmaBuffer buffer = make(0, 1000, true);
  EXPECT_NE(buffer.to_string().find("cuda:0"), std::string::npos) << buffer.to_string();
  ScopedEnv forbid("CASTMESH_RDMA_FALLBACK", "error");
  auto dst = device_filled(1000, 9, gpu(0));
  ASSERT_TRUE(dst.ok());
  auto read = buffer.read_into(*dst).get(absl::Seconds(30));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_EQ(device_mismatch(*dst, 0, 1000, 0, 9), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, RdmaDeviceAcrossProcsFake,
                         ::testing::Values(Path::kDefault, Path::kSharedSegment, Path::kSocket),
                         [](const auto& info) {
                           switch (info.param) {
                             case Path::kDefault: return "Default";
                             case Path::kSharedSegment: return "SharedSegment";
                             case Path::kSocket: return "Socket";
                           }
                           return "Unknown";
                         });

// A proc without the tensor_engine backend refuses device memory, saying how to install it.
TEST(RdmaDeviceMissingBackendFake, RegisteringDeviceMemoryNamesTheInstall) {
  castmesh::testing::WorkerProcs procs(1, {.env = {{"CASTMESH_BACKEND_PATH", "/nonexistent-castmesh-backends"}}});
  ASSERT_TRUE(procs.ok());  // the backend path is the worker's only
  auto owners = procs.procs().spawn<DeviceOwner>("owner");
  ASSERT_TRUE(owners.ok()) << owners.status();
  auto answer = owners->at(0).ask(RegisterWithoutBackend{}).get(absl::Seconds(30));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_NE(answer->find("FAILED_PRECONDITION"), std::string::npos) << *answer;
  EXPECT_NE(answer->find("castmesh[tensor-engine]"), std::string::npos) << *answer;
}

}  // namespace
