// RDMA buffers over CUDA/ROCm memory: host staging through the tensor_engine
// backend, where no NIC can reach device memory (docs/rdma.md, "Device memory").
//
// Owner side: a buffer registered over device memory offers only the
// transports in which the owner's CPU moves the bytes (same process, shared
// segment, socket), never one-sided copies or leases (a peer's
// process_vm_readv cannot read device memory). copy_out/copy_in move a range
// between the buffer and host memory; a ReadStager gives READ_DATA chunks in
// pinned host memory, a bounded number of them alive per read.
// Requester side: staged() runs a read into / write from device memory as one
// host operation on a host staging buffer plus a device copy.
//
// Device copies run on castmesh's staging stream of the device and are
// synchronised before a function returns. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "castmesh/future.h"
#include "castmesh/rdma.h"
#include "core/rdma/registry.h"
#include "core/wire/payload.h"

namespace castmesh::rdma {

// True for memory a tensor_engine backend drives (CUDA or ROCm).
bool is_device_memory(const TensorView& view);

// OK when the tensor_engine backend is loaded and drives `view`'s device;
// else FailedPrecondition naming pip install "castmesh[tensor-engine]" (or
// InvalidArgument for a device it does not drive). `what` names the caller's object.
absl::Status check_device_backend(const TensorView& view, std::string_view what);

// Copies bytes [offset, offset+n) of `registration` into host memory `dst`.
absl::Status copy_out(const Registration& registration, uint64_t offset, char* dst, size_t n);
// Copies `n` host bytes from `src` to `offset` of `registration`.
absl::Status copy_in(const Registration& registration, uint64_t offset, const char* src, size_t n);

// The READ_DATA bodies of one read of a registration: its memory itself for
// host memory, else pinned host copies, at most kStagedChunksPerRead of them
// alive at once, so a 1 GiB read needs a few chunks of staging, not 1 GiB.
class ReadStager {
 public:
  explicit ReadStager(std::shared_ptr<const Registration> registration);
  // Bytes [offset, offset+n) as a message body. For device memory it may
  // wait until an earlier chunk of this read was sent: call it on a thread
  // that may block, never an I/O thread.
  absl::StatusOr<wire::Payload> chunk(uint64_t offset, size_t n);

  struct Budget;

 private:
  std::shared_ptr<const Registration> registration_;
  std::shared_ptr<Budget> budget_;
};

// Pinned chunks one staged read keeps alive at once.
inline constexpr int kStagedChunksPerRead = 4;

// The host operation of a staged one: moves `length` bytes between the
// buffer and `host` (a host view of that size).
using HostOperation = std::function<Future<RdmaResult>(const TensorView& host)>;

// Runs a read into (`write` false) or a write from (`write` true) the first
// `length` bytes of device memory `local` through a host buffer: a write
// copies device -> host before `host_op` sends; a read copies host -> device
// after `host_op` succeeded, before the Future resolves. The result says
// staged. A failed host operation leaves `local` untouched.
Future<RdmaResult> staged(const TensorView& local, bool write, size_t length, const HostOperation& host_op);

}  // namespace castmesh::rdma
