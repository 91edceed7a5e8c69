// RdmaBuffer: within one process, and across real worker procs (this binary
// re-executed) over same-host one-sided copies, single copy with a lease, a
// shared segment and the socket transport.
#include <signal.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include <cstddef>
#endif

#include <gtest/gtest.h>

#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "castmesh/castmesh.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/rdma.h"
#include "rdma_test_bytes.h"
#include "rdma_test_procs.h"
#include "core/platform/platform.h"

namespace {

using castmesh::DType;
using castmesh::RdmaAccess;
using castmesh::RdmaBatch;
using castmesh::RdmaBuffer;
using castmesh::RdmaOptions;
using castmesh::RdmaResult;
using castmesh::RdmaTransport;
using castmesh::TensorView;

using castmesh::rdma_test::decode_numbers;
using castmesh::rdma_test::encode_numbers;
using castmesh::rdma_test::filled;
using castmesh::rdma_test::mismatch;
using castmesh::rdma_test::Numbers;
using castmesh::rdma_test::pattern;

// Owner: registers memory filled with pattern(seed 1). Verify: {seed, offset, length} -> "" when the
// owner's bytes [offset, offset+length) are pattern(0.., seed) (what write_from(filled(length, seed)) wrote),
// else the first difference.
struct MakeBuffer {
  Numbers n;  // size, access
};
struct Verify {
  Numbers n;  // seed, offset, length
};
// Makes the kernel refuse cross-memory attach in the receiving process.
struct RefuseCrossMemory {
  Numbers n;  // unused
};
// Changes entry `slot` of the one-sided table the receiving process mapped,
// as a hostile or broken requester could: what 0 = count a copy in flight
// that never leaves, 1 = a corrupt access field, 2 = the access field back to read+write.
struct TamperTable {
  Numbers n;  // slot, what
};
absl::Status encode_make(const MakeBuffer& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_make(std::string_view b, MakeBuffer* m) { return decode_numbers(b, &m->n); }
absl::Status encode_verify(const Verify& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_verify(std::string_view b, Verify* m) { return decode_numbers(b, &m->n); }
absl::Status encode_refuse(const RefuseCrossMemory& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_refuse(std::string_view b, RefuseCrossMemory* m) { return decode_numbers(b, &m->n); }
absl::Status encode_tamper(const TamperTable& m, std::string* out) { return encode_numbers(m.n, out); }
absl::Status decode_tamper(std::string_view b, TamperTable* m) { return decode_numbers(b, &m->n); }

// The one-sided table this process mapped: a deleted 64 KiB /dev/shm object
// of castmesh (the requester unlinks it once mapped). nullptr when none.
uint64_t* mapped_one_sided_table() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/castmesh-rdma-") == std::string::npos || line.find("(deleted)") == std::string::npos) continue;
    std::vector<std::string> range = absl::StrSplit(line.substr(0, line.find(' ')), '-');
    uint64_t begin = 0, end = 0;
    if (range.size() == 2 && absl::SimpleHexAtoi(range[0], &begin) && absl::SimpleHexAtoi(range[1], &end) &&
        end - begin == 64 * 1024) {
      return reinterpret_cast<uint64_t*>(begin);
    }
  }
  return nullptr;
}

// The one-sided slot (RdmaHandle field 10) of a serialized handle, or -1 when malformed.
int64_t one_sided_slot_of(const std::string& bytes) {
  size_t at = 0;
  auto varint = [&](uint64_t* value) {
    *value = 0;
    for (int shift = 0; at < bytes.size() && shift < 64; shift += 7) {
      const auto byte = static_cast<uint8_t>(bytes[at++]);
      *value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  uint64_t tag = 0, value = 0;
  while (at < bytes.size() && varint(&tag)) {
    switch (tag & 7) {
      case 0:
        if (!varint(&value)) return -1;
        if ((tag >> 3) == 10) return static_cast<int64_t>(value);
        break;
      case 1: at += 8; break;
      case 2:
        if (!varint(&value)) return -1;
        at += value;
        break;
      case 5: at += 4; break;
      default: return -1;
    }
  }
  return at == bytes.size() ? 0 : -1;  // proto3 leaves a 0 out
}

// A seccomp filter on every thread of this process that fails
// process_vm_readv / process_vm_writev with EPERM, as a container runtime's
// profile does. "" when installed, else why not.
std::string refuse_cross_memory_attach() {
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#else
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return absl::StrCat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno));
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) != 0) {
    return absl::StrCat("seccomp: ", std::strerror(errno));
  }
  // An emulator (qemu-user) may take the filter for its own architecture: check it bites.
  char from = 1, to = 0;
  iovec local{&to, 1}, remote{&from, 1};
  if (::syscall(SYS_process_vm_readv, ::getpid(), &local, 1, &remote, 1, 0) >= 0 || errno != EPERM) {
    return "the seccomp filter did not refuse process_vm_readv here";
  }
  return "";
#else
  return "no seccomp filter for this system";
#endif
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(MakeBuffer, "castmesh.test.rdma.MakeBuffer", encode_make, decode_make);
CASTMESH_REGISTER_MESSAGE(Verify, "castmesh.test.rdma.Verify", encode_verify, decode_verify);
CASTMESH_REGISTER_MESSAGE(RefuseCrossMemory, "castmesh.test.rdma.RefuseCrossMemory", encode_refuse, decode_refuse);
CASTMESH_REGISTER_MESSAGE(TamperTable, "castmesh.test.rdma.TamperTable", encode_tamper, decode_tamper);

namespace {

class Owner : public castmesh::Actor {
 public:
  absl::StatusOr<RdmaBuffer> make(const MakeBuffer& m) {
    memory_ = filled(static_cast<size_t>(m.n.values.at(0)), 1);
    return RdmaBuffer::register_memory(memory_, static_cast<RdmaAccess>(m.n.values.at(1)));
  }
  std::string verify(const Verify& m) {
    const auto offset = static_cast<size_t>(m.n.values.at(1));
    return mismatch(static_cast<char*>(memory_.data()) + offset, 0, static_cast<size_t>(m.n.values.at(2)),
                    static_cast<int>(m.n.values.at(0)));
  }
  using Handlers = castmesh::Handlers<&Owner::make, &Owner::verify>;

 private:
  TensorView memory_;
};

// Reads a whole buffer it was handed by a third party; "" or the first difference.
class Reader : public castmesh::Actor {
 public:
  castmesh::Future<std::string> read(const RdmaBuffer& buffer) {
    auto into = std::make_shared<TensorView>(TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(buffer.size())}));
    return buffer.read_into(*into).then([into](RdmaResult r) -> std::string {
      return absl::StrCat(std::string(castmesh::rdma_transport_name(r.transport)), ":", mismatch(into->data(), 0, r.bytes, 1));
    });
  }
  std::string refuse(const RefuseCrossMemory&) { return refuse_cross_memory_attach(); }
  std::string tamper(const TamperTable& m) {
    uint64_t* table = mapped_one_sided_table();
    if (table == nullptr) return "no one-sided table is mapped in this process";
    uint64_t* entry = table + 8 * (1 + m.n.values.at(0));  // 64-byte header, 64-byte entries: word, address, size, access
    switch (m.n.values.at(1)) {
      case 0: __atomic_fetch_add(&entry[0], 1, __ATOMIC_SEQ_CST); break;
      case 1: __atomic_store_n(&entry[3], 9, __ATOMIC_SEQ_CST); break;
      default: __atomic_store_n(&entry[3], 3, __ATOMIC_SEQ_CST); break;
    }
    return "";
  }
  using Handlers = castmesh::Handlers<&Reader::read, &Reader::refuse, &Reader::tamper>;
};

}  // namespace

CASTMESH_REGISTER_ACTOR(Owner);
CASTMESH_REGISTER_ACTOR(Reader);

namespace {

// ---- one process ----

class RdmaLocal : public ::testing::Test {
 protected:
  castmesh::Runtime runtime_;
};

TEST_F(RdmaLocal, ReadsAndWritesWithOffsets) {
  TensorView memory = filled(10000, 1);
  auto buffer = RdmaBuffer::register_memory(memory, RdmaAccess::kReadWrite, &runtime_);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->size(), 10000u);
  EXPECT_EQ(buffer->owner(), runtime_.proc_id());

  TensorView dst = TensorView::Allocate(DType::kUInt8, {300});
  auto read = buffer->read_into(dst, RdmaOptions{.offset = 1234}).get(absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes, 300u);
  EXPECT_EQ(read->transport, RdmaTransport::kSameProcess);
  EXPECT_EQ(mismatch(dst.data(), 1234, 300, 1), "");

  auto partial = buffer->read_into(dst, RdmaOptions{.offset = 9990, .length = 10}).get(absl::Seconds(10));
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(partial->bytes, 10u);

  TensorView src = filled(500, 2);
  auto wrote = buffer->write_from(src, RdmaOptions{.offset = 100}).get(absl::Seconds(10));
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_EQ(mismatch(static_cast<char*>(memory.data()) + 100, 0, 500, 2), "");
  EXPECT_EQ(mismatch(memory.data(), 0, 100, 1), "");  // untouched before the range
}

TEST_F(RdmaLocal, BadRequestsFailBeforeAnyByteMoves) {
  TensorView memory = filled(4096, 1);
  auto readonly = RdmaBuffer::register_memory(memory, RdmaAccess::kRead, &runtime_);
  ASSERT_TRUE(readonly.ok());
  TensorView dst = TensorView::Allocate(DType::kUInt8, {100});
  EXPECT_EQ(readonly->read_into(dst, RdmaOptions{.offset = 4000}).get().status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(readonly->read_into(dst, RdmaOptions{.length = 101}).get().status().code(),
            absl::StatusCode::kInvalidArgument);  // destination too small
  EXPECT_EQ(readonly->write_from(dst).get().status().code(), absl::StatusCode::kPermissionDenied);
  TensorView frozen = TensorView::Contiguous(dst.data(), DType::kUInt8, {100}, nullptr, /*read_only=*/true);
  EXPECT_EQ(readonly->read_into(frozen).get().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RdmaBuffer::register_memory(frozen, RdmaAccess::kWrite, &runtime_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RdmaBuffer().read_into(dst).get().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mismatch(memory.data(), 0, 4096, 1), "");
}

TEST_F(RdmaLocal, ReleaseIsIdempotentAndLaterUseFails) {
  TensorView memory = filled(64, 1);
  auto buffer = RdmaBuffer::register_memory(memory, RdmaAccess::kReadWrite, &runtime_);
  ASSERT_TRUE(buffer.ok());
  RdmaBuffer copy = *buffer;
  ASSERT_TRUE(buffer->release().get().ok());
  ASSERT_TRUE(copy.release().get().ok());
  TensorView dst = TensorView::Allocate(DType::kUInt8, {64});
  auto read = copy.read_into(dst).get();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find("released"), std::string::npos) << read.status();
}

TEST_F(RdmaLocal, HandleRoundTripsThroughBytes) {
  TensorView memory = filled(77, 1);
  auto buffer = RdmaBuffer::register_memory(memory, RdmaAccess::kRead, &runtime_);
  ASSERT_TRUE(buffer.ok());
  auto back = RdmaBuffer::deserialize(buffer->serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), 77u);
  EXPECT_EQ(back->owner(), buffer->owner());
  EXPECT_EQ(back->access(), RdmaAccess::kRead);
  EXPECT_EQ(back->transports(), buffer->transports());
  EXPECT_FALSE(RdmaBuffer::deserialize("\xff\xff garbage").ok());
  TensorView dst = TensorView::Allocate(DType::kUInt8, {77});
  ASSERT_TRUE(back->read_into(dst).get().ok());
  EXPECT_EQ(mismatch(dst.data(), 0, 77, 1), "");
}

TEST_F(RdmaLocal, BatchRejectsOverlappingWritesAndCompletesOnce) {
  TensorView memory = filled(1000, 1);
  auto buffer = RdmaBuffer::register_memory(memory, RdmaAccess::kReadWrite, &runtime_);
  ASSERT_TRUE(buffer.ok());
  TensorView a = filled(100, 3), b = filled(100, 4), dst = TensorView::Allocate(DType::kUInt8, {50});
  RdmaBatch batch;
  ASSERT_TRUE(batch.add_write(*buffer, a, RdmaOptions{.offset = 0}).ok());
  EXPECT_EQ(batch.add_write(*buffer, b, RdmaOptions{.offset = 99}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(batch.add_write(*buffer, b, RdmaOptions{.offset = 100}).ok());
  ASSERT_TRUE(batch.add_read(*buffer, dst, RdmaOptions{.offset = 500}).ok());
  auto results = batch.submit().get(absl::Seconds(10));
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_EQ(mismatch(memory.data(), 0, 100, 3), "");
  EXPECT_EQ(mismatch(static_cast<char*>(memory.data()) + 100, 0, 100, 4), "");
  EXPECT_EQ(mismatch(dst.data(), 500, 50, 1), "");
  EXPECT_EQ(batch.submit().get().status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- across procs ----

using castmesh::rdma_test::ScopedEnv;
using castmesh::rdma_test::stop_process;

constexpr size_t kChunk = 4096;

// Whether process `pid` has exited (a zombie or reaped).
bool process_gone(int64_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

// The same-host path a test forces (the switches are inherited by the worker procs):
// one-sided copies (the default), single copy with a lease (one-sided off), ...
enum class Path { kOneSided, kSingleCopy, kSharedSegment, kSocket };

// Names of this process's shared segments still in /dev/shm (none may outlive an operation).
std::vector<std::string> leftover_segments() {
  std::vector<std::string> found;
  const std::string prefix = absl::StrCat("castmesh-rdma-", ::getpid(), "-");
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path().string());
  }
  return found;
}

class RdmaAcrossProcs : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    auto procs = castmesh::LocalAllocator().allocate(runtime_, 2);
    ASSERT_TRUE(procs.ok()) << procs.status();
    procs_ = *procs;
    auto owners = procs_.spawn<Owner>("owner");
    ASSERT_TRUE(owners.ok()) << owners.status();
    owners_ = *owners;
  }
  void TearDown() override {
    (void)procs_.stop();
    EXPECT_EQ(absl::StrJoin(leftover_segments(), ", "), "");
  }

  RdmaBuffer make(size_t owner, size_t size, RdmaAccess access = RdmaAccess::kReadWrite) {
    auto made = owners_.at(owner).ask(MakeBuffer{{{static_cast<int64_t>(size), static_cast<int64_t>(access)}}})
                    .get(absl::Seconds(30));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : RdmaBuffer();
  }
  std::string verify(size_t owner, int seed, size_t offset, size_t length) {
    auto answer = owners_.at(owner)
                      .ask(Verify{{{seed, static_cast<int64_t>(offset), static_cast<int64_t>(length)}}})
                      .get(absl::Seconds(30));
    return answer.ok() ? *answer : answer.status().ToString();
  }
  // Single copy needs Linux's cross-memory attach; without it (a
  // posix-fallbacks build) a shared segment is chosen instead.
  RdmaTransport expected() const {
    switch (GetParam()) {
      case Path::kOneSided:
      case Path::kSingleCopy:
        return castmesh::platform::uses_linux_facilities() ? RdmaTransport::kSingleCopy
                                                           : RdmaTransport::kSharedSegment;
      case Path::kSharedSegment: return RdmaTransport::kSharedSegment;
      case Path::kSocket: return RdmaTransport::kSocket;
    }
    return RdmaTransport::kSocket;
  }

  ScopedEnv chunk_{"CASTMESH_RDMA_CHUNK_BYTES", "4096"};
  // Whether operations of every size copy one-sided (no message to the owner).
  bool one_sided() const {
    return GetParam() == Path::kOneSided && castmesh::platform::uses_linux_facilities();
  }

  ScopedEnv single_copy_{"CASTMESH_RDMA_SINGLE_COPY",
                         GetParam() == Path::kSingleCopy || GetParam() == Path::kOneSided ? "1" : "0"};
  ScopedEnv one_sided_{"CASTMESH_RDMA_ONE_SIDED", GetParam() == Path::kOneSided ? "1" : "0"};
  ScopedEnv shared_segment_{"CASTMESH_RDMA_SHARED_SEGMENT", GetParam() == Path::kSocket ? "0" : "1"};
  castmesh::Runtime runtime_;
  castmesh::ProcMesh procs_;
  std::vector<castmesh::ActorRef<Owner>> owners_;
};

TEST_P(RdmaAcrossProcs, SizesAroundTheChunkBothWays) {
  for (size_t size : {size_t{1}, size_t{4095}, size_t{4096}, kChunk - 1, kChunk + 1, size_t{300000},
                      (size_t{64} << 20) + 3}) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    RdmaBuffer buffer = make(0, size);
    ASSERT_TRUE(buffer.valid());
    TensorView dst = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
    auto read = buffer.read_into(dst).get(absl::Seconds(60));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->bytes, size);
    if (size >= 64 * 1024 || one_sided()) {
      EXPECT_EQ(read->transport, expected());
    }
    ASSERT_EQ(mismatch(dst.data(), 0, size, 1), "");
    TensorView src = filled(size, 2);
    auto wrote = buffer.write_from(src).get(absl::Seconds(60));
    ASSERT_TRUE(wrote.ok()) << wrote.status();
    EXPECT_EQ(verify(0, 2, 0, size), "");
    ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  }
}

TEST_P(RdmaAcrossProcs, OffsetsLengthsAndErrors) {
  RdmaBuffer buffer = make(0, 200000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {150000});
  auto read = buffer.read_into(dst, RdmaOptions{.offset = 12345, .length = 100001}).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(mismatch(dst.data(), 12345, 100001, 1), "");
  TensorView src = filled(70001, 5);
  ASSERT_TRUE(buffer.write_from(src, RdmaOptions{.offset = 129999}).get(absl::Seconds(30)).ok());
  EXPECT_EQ(verify(0, 5, 129999, 70001), "");
  EXPECT_EQ(buffer.read_into(dst, RdmaOptions{.offset = 199999, .length = 2}).get().status().code(),
            absl::StatusCode::kOutOfRange);
  RdmaBuffer readonly = make(1, 100000, RdmaAccess::kRead);
  EXPECT_EQ(readonly.write_from(src).get().status().code(), absl::StatusCode::kPermissionDenied);
  // Released by a proc that is not the owner; later use fails on the owner's word.
  ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  auto late = buffer.read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("released"), std::string::npos) << late.status();
  // A write of many chunks (the owner receives them in place where the socket has not delivered them yet)
  // fails once, on the owner's word, and the connection stays usable.
  auto late_write = buffer.write_from(filled(150000, 6)).get(absl::Seconds(30));
  EXPECT_EQ(late_write.status().code(), absl::StatusCode::kFailedPrecondition) << late_write.status();
  RdmaBuffer other = make(0, 1000);
  ASSERT_TRUE(other.write_from(filled(1000, 7)).get(absl::Seconds(30)).ok());
  EXPECT_EQ(verify(0, 7, 0, 1000), "");
}

TEST_P(RdmaAcrossProcs, ConcurrentReadersAndWritersOnOneBuffer) {
  constexpr size_t kPart = 100000;
  RdmaBuffer buffer = make(0, 8 * kPart);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(8);
  for (size_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      if (t % 2 == 0) {
        TensorView dst = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(kPart)});
        for (int round = 0; round < 3; ++round) {
          auto r = buffer.read_into(dst, RdmaOptions{.offset = t * kPart}).get(absl::Seconds(60));
          if (!r.ok()) errors[t] = r.status().ToString();
          else if (std::string m = mismatch(dst.data(), t * kPart, kPart, 1); !m.empty()) errors[t] = m;
        }
      } else {
        TensorView src = filled(kPart, static_cast<int>(10 + t));
        auto w = buffer.write_from(src, RdmaOptions{.offset = t * kPart}).get(absl::Seconds(60));
        if (!w.ok()) errors[t] = w.status().ToString();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < 8; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  for (size_t t = 1; t < 8; t += 2) EXPECT_EQ(verify(0, static_cast<int>(10 + t), t * kPart, kPart), "") << t;
}

TEST_P(RdmaAcrossProcs, BatchOfReadsAndWritesOnTwoOwners) {
  RdmaBuffer a = make(0, 300000), b = make(1, 5000);
  TensorView dst_a = TensorView::Allocate(DType::kUInt8, {300000});
  TensorView dst_b = TensorView::Allocate(DType::kUInt8, {5000});
  TensorView src = filled(1000, 7);
  RdmaBatch batch;
  ASSERT_TRUE(batch.add_read(a, dst_a).ok());
  ASSERT_TRUE(batch.add_read(b, dst_b).ok());
  ASSERT_TRUE(batch.add_write(b, src, RdmaOptions{.offset = 4000}).ok());
  auto results = batch.submit(absl::Seconds(60)).get(absl::Seconds(60));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(mismatch(dst_a.data(), 0, 300000, 1), "");
  EXPECT_EQ(mismatch(dst_b.data(), 0, 4000, 1), "");  // the read and the write of [4000, 5000) race
  EXPECT_EQ(verify(1, 7, 4000, 1000), "");
}

TEST_P(RdmaAcrossProcs, HandlePassedThroughAThirdActor) {
  RdmaBuffer buffer = make(0, 200000);
  auto readers = procs_.spawn<Reader>("reader");
  ASSERT_TRUE(readers.ok()) << readers.status();
  auto answer = readers->at(1).ask(buffer).get(absl::Seconds(60));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, std::string(castmesh::rdma_transport_name(expected())) + ":");
}

TEST_P(RdmaAcrossProcs, StoppedOwnerTimesOutAndNoLateByteLands) {
  RdmaBuffer buffer = make(0, 300000);
  const int64_t pid = procs_.proc(0).pid;
  // A destination with guard bytes around it.
  std::vector<uint8_t> memory(300000 + 2 * 4096, 0xAB);
  TensorView dst = TensorView::Contiguous(memory.data() + 4096, DType::kUInt8, {300000});
  if (one_sided()) {
    TensorView first = TensorView::Allocate(DType::kUInt8, {10});
    ASSERT_TRUE(buffer.read_into(first).get(absl::Seconds(30)).ok());  // the owner's table is open
  }
  stop_process(pid);
  auto read = buffer.read_into(dst, RdmaOptions{.timeout = absl::Milliseconds(500)}).get(absl::Seconds(30));
  if (one_sided()) {  // as with a NIC: the owner's CPU takes no part, so a stopped owner is read
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(mismatch(memory.data() + 4096, 0, 300000, 1), "");
    ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGCONT), 0);
    return;
  }
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded) << read.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGCONT), 0);
  // The owner now answers the request it held; none of it may land.
  EXPECT_EQ(verify(0, 2, 0, 0), "");  // a round trip after the late answer
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (size_t i = 0; i < memory.size(); ++i) ASSERT_EQ(memory[i], 0xAB) << "byte " << i;
  // The buffer still works afterwards.
  auto again = buffer.read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(again.ok()) << again.status();
}

TEST_P(RdmaAcrossProcs, ReadTimingOutMidTransferWritesNothingAfterTheFailure) {
  constexpr size_t kSize = size_t{64} << 20;  // thousands of 4 KiB chunks: still moving after 20 ms
  RdmaBuffer buffer = make(0, kSize);
  std::vector<uint8_t> memory(kSize + 2 * 4096, 0xAB);
  TensorView dst = TensorView::Contiguous(memory.data() + 4096, DType::kUInt8, {static_cast<int64_t>(kSize)});
  auto read = buffer.read_into(dst, RdmaOptions{.timeout = absl::Milliseconds(20)}).get(absl::Seconds(60));
  const std::vector<uint8_t> reported = memory;  // the destination when the failure was reported
  if (read.ok()) {  // a machine fast enough to finish: then the bytes must be right
    EXPECT_EQ(mismatch(memory.data() + 4096, 0, kSize, 1), "");
    return;
  }
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded) << read.status();
  EXPECT_EQ(verify(0, 2, 0, 0), "");  // a round trip behind what the owner still sends
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto differs = std::mismatch(memory.begin(), memory.end(), reported.begin());
  EXPECT_TRUE(differs.first == memory.end()) << "byte " << (differs.first - memory.begin()) << " changed after the failure";
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(memory[i], 0xAB) << "guard byte " << i;
  for (size_t i = kSize + 4096; i < memory.size(); ++i) ASSERT_EQ(memory[i], 0xAB) << "guard byte " << i;
}

// The contract: pending operations fail within 2 s of the owner's
// death. The loss is seen by events, not timers (the connection's end of
// file; a one-sided copy's ESRCH), so the bound holds on a loaded machine.
TEST_P(RdmaAcrossProcs, KilledOwnerFailsPendingOperationsQuickly) {
  RdmaBuffer buffer = make(0, 300000);
  const int64_t pid = procs_.proc(0).pid;
  TensorView dst = TensorView::Allocate(DType::kUInt8, {300000});
  if (one_sided()) {
    ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());  // the table is open
  }
  stop_process(pid);
  // One-sided: nothing waits for a stopped owner, so the read starts after the kill.
  castmesh::Future<RdmaResult> pending;
  if (!one_sided()) pending = buffer.read_into(dst, RdmaOptions{.timeout = absl::Seconds(60)});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  absl::Time killed = absl::Now();
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  if (one_sided()) {
    // Until the kernel has torn the process down its memory can still be read: wait for that.
    for (int i = 0; i < 500 && !process_gone(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    killed = absl::Now();
    pending = buffer.read_into(dst, RdmaOptions{.timeout = absl::Seconds(60)});
  }
  auto result = pending.get(absl::Seconds(30));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));
}

TEST_P(RdmaAcrossProcs, ForbiddenFallbackIsAnExplicitError) {
  RdmaBuffer buffer = make(0, 1000);
  ScopedEnv forbid("CASTMESH_RDMA_FALLBACK", "error");
  TensorView dst = TensorView::Allocate(DType::kUInt8, {1000});
  auto read = buffer.read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find("CASTMESH_RDMA_FALLBACK"), std::string::npos) << read.status();
  ScopedEnv bad("CASTMESH_RDMA_FALLBACK", "sometimes");
  EXPECT_EQ(buffer.read_into(dst).get().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(RdmaAcrossProcs, AnOperationsFallbackOverridesTheSettingsTable) {
  RdmaBuffer buffer = make(0, 1000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {1000});
  auto refused = buffer.read_into(dst, RdmaOptions{.fallback = castmesh::config::RdmaFallback::kError}).get(
      absl::Seconds(30));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  ScopedEnv forbid("CASTMESH_RDMA_FALLBACK", "error");
  auto allowed =
      buffer.read_into(dst, RdmaOptions{.fallback = castmesh::config::RdmaFallback::kAuto}).get(absl::Seconds(30));
  EXPECT_TRUE(allowed.ok()) << allowed.status();
}

TEST_P(RdmaAcrossProcs, HandleOfferingATransportThisProcLacksStillWorks) {
  RdmaBuffer buffer = make(0, 100000);
  // Append transports = [ibverbs] (field 7, varint 1) as a NIC-equipped owner would.
  std::string bytes = buffer.serialize() + std::string("\x38\x01", 2);
  auto nic = RdmaBuffer::deserialize(bytes);
  ASSERT_TRUE(nic.ok()) << nic.status();
  EXPECT_EQ(nic->transports().back(), RdmaTransport::kIbverbs);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {100000});
  auto read = nic->read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->transport, expected());
  EXPECT_EQ(mismatch(dst.data(), 0, 100000, 1), "");
}

TEST_P(RdmaAcrossProcs, RefusedCrossMemoryAttachFallsBackToASharedSegment) {
  if (GetParam() != Path::kSingleCopy && GetParam() != Path::kOneSided) {
    GTEST_SKIP() << "only where single copy is allowed";
  }
  auto readers = procs_.spawn<Reader>("reader");
  ASSERT_TRUE(readers.ok()) << readers.status();
  auto refused = readers->at(1).ask(RefuseCrossMemory{}).get(absl::Seconds(30));
  ASSERT_TRUE(refused.ok()) << refused.status();
  if (!refused->empty()) GTEST_SKIP() << "cannot make the kernel refuse cross-memory attach here: " << *refused;
  for (int round = 0; round < 2; ++round) {  // the first tries single copy and falls back, the second skips it
    RdmaBuffer buffer = make(0, 200000 + round);
    auto answer = readers->at(1).ask(buffer).get(absl::Seconds(60));
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(*answer, "shared_segment:") << "round " << round;
  }
}

TEST_P(RdmaAcrossProcs, StoppedOwnerWriteTimesOutAndTheBufferStillWorks) {
  RdmaBuffer buffer = make(0, 300000);
  const int64_t pid = procs_.proc(0).pid;
  TensorView src = filled(300000, 3);
  if (one_sided()) {
    TensorView first = TensorView::Allocate(DType::kUInt8, {10});
    ASSERT_TRUE(buffer.read_into(first).get(absl::Seconds(30)).ok());  // the owner's table is open
  }
  stop_process(pid);
  auto wrote = buffer.write_from(src, RdmaOptions{.timeout = absl::Milliseconds(500)}).get(absl::Seconds(30));
  if (one_sided()) {  // as with a NIC: written while the owner is stopped
    ASSERT_TRUE(wrote.ok()) << wrote.status();
  } else {
    EXPECT_EQ(wrote.status().code(), absl::StatusCode::kDeadlineExceeded) << wrote.status();
  }
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGCONT), 0);
  auto again = buffer.write_from(src).get(absl::Seconds(30));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transport, expected());
  EXPECT_EQ(verify(0, 3, 0, 300000), "");
}

// A handle's one-sided slot and generation come from the network: a forged
// or corrupt pair is a clear error (a slot outside the owner's table:
// kInvalidArgument; another generation: "was released"), never an access
// outside the table. Where one-sided copies are off the pair is not used.
TEST_P(RdmaAcrossProcs, CorruptOneSidedSlotOrGenerationIsAClearError) {
  RdmaBuffer buffer = make(0, 5000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {5000});
  ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());  // the owner's table is open (one-sided)
  auto varint = [](uint64_t value) {
    std::string out;
    for (; value >= 0x80; value >>= 7) out.push_back(static_cast<char>(0x80 | (value & 0x7f)));
    out.push_back(static_cast<char>(value));
    return out;
  };
  // RdmaHandle field 10 (one_sided_slot) and 11 (one_sided_generation); the last value of a field wins.
  const std::string far_slot = buffer.serialize() + "\x50" + varint(1u << 30);
  const std::string last_slot = buffer.serialize() + "\x50" + varint(1022);
  const std::string other_generation = buffer.serialize() + "\x58" + varint(uint64_t{1} << 47);
  const std::string huge_generation = buffer.serialize() + "\x58" + varint(~uint64_t{0});
  struct Case {
    const std::string* bytes;
    absl::StatusCode code;
    const char* says;
  };
  for (const Case& c : {Case{&far_slot, absl::StatusCode::kInvalidArgument, "corrupt handle"},
                        Case{&huge_generation, absl::StatusCode::kInvalidArgument, "corrupt handle"},
                        Case{&last_slot, absl::StatusCode::kFailedPrecondition, "released"},
                        Case{&other_generation, absl::StatusCode::kFailedPrecondition, "released"}}) {
    auto forged = RdmaBuffer::deserialize(*c.bytes);
    ASSERT_TRUE(forged.ok()) << forged.status();
    std::vector<uint8_t> memory(5000 + 2 * 64, 0xAB);
    TensorView into = TensorView::Contiguous(memory.data() + 64, DType::kUInt8, {5000});
    auto read = forged->read_into(into).get(absl::Seconds(30));
    auto wrote = forged->write_from(filled(5000, 9)).get(absl::Seconds(30));
    if (!one_sided()) {  // the pair is not used: the owner's registration id still names the buffer
      ASSERT_TRUE(read.ok()) << read.status();
      ASSERT_TRUE(wrote.ok()) << wrote.status();
      continue;
    }
    EXPECT_EQ(read.status().code(), c.code) << read.status();
    EXPECT_NE(read.status().message().find(c.says), std::string::npos) << read.status();
    EXPECT_EQ(wrote.status().code(), c.code) << wrote.status();
    for (uint8_t byte : memory) ASSERT_EQ(byte, 0xAB);
  }
  // One-sided: no forged write landed (the owner's bytes are still make()'s); else the writes did.
  EXPECT_EQ(verify(0, one_sided() ? 1 : 9, 0, 5000), "");
  // The genuine handle still works.
  ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());
}

// What a requester's table holds is checked where it is read: a corrupt
// entry is a clear error. A requester whose count never comes back (it
// died inside a copy, or scribbled on its table) holds the release only
// until its proc is lost.
TEST_P(RdmaAcrossProcs, CorruptOrWedgedOneSidedTableEntry) {
  if (!one_sided()) GTEST_SKIP() << "one-sided copies only";
  RdmaBuffer buffer = make(0, 5000);
  const int64_t slot = one_sided_slot_of(buffer.serialize());
  ASSERT_GE(slot, 0);
  auto readers = procs_.spawn<Reader>("reader");
  ASSERT_TRUE(readers.ok()) << readers.status();
  auto read = [&] { return readers->at(1).ask(buffer).get(absl::Seconds(30)); };
  auto tamper = [&](int64_t what) {
    auto done = readers->at(1).ask(TamperTable{{{slot, what}}}).get(absl::Seconds(30));
    return done.ok() ? *done : done.status().ToString();
  };
  auto first = read();  // maps the owner's table in proc 1
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "single_copy:");
  ASSERT_EQ(tamper(1), "");
  auto corrupt = read();
  EXPECT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.status().message().find("corrupt"), std::string::npos) << corrupt.status();
  ASSERT_EQ(tamper(2), "");
  auto repaired = read();
  ASSERT_TRUE(repaired.ok()) << repaired.status();
  EXPECT_EQ(*repaired, "single_copy:");
  // A copy that never leaves: the owner keeps the memory (release does not resolve) until proc 1 is lost.
  ASSERT_EQ(tamper(0), "");
  castmesh::Future<castmesh::Unit> released = buffer.release();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(released.ready()) << "release() resolved while a requester counted a copy in flight";
  ASSERT_EQ(::kill(static_cast<pid_t>(procs_.proc(1).pid), SIGKILL), 0);
  auto after = released.get(absl::Seconds(30));
  EXPECT_TRUE(after.ok()) << after.status();
  TensorView dst = TensorView::Allocate(DType::kUInt8, {5000});
  EXPECT_EQ(buffer.read_into(dst).get(absl::Seconds(30)).status().code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Transports, RdmaAcrossProcs,
                         ::testing::Values(Path::kOneSided, Path::kSingleCopy, Path::kSharedSegment, Path::kSocket),
                         [](const auto& info) {
                           switch (info.param) {
                             case Path::kOneSided: return "OneSided";
                             case Path::kSingleCopy: return "SingleCopy";
                             case Path::kSharedSegment: return "SharedSegment";
                             case Path::kSocket: return "Socket";
                           }
                           return "Unknown";
                         });

}  // namespace
