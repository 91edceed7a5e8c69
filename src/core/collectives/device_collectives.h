// Collectives on device (CUDA/ROCm) buffers: the Communicator's calls on
// TensorViews of device memory go to the tensor_engine backend (NCCL/RCCL)
// instead of the CPU algorithms. docs/collectives.md, "Device buffers".
//
// Per communicator (CommGroup) and rank, a device communicator is made at the
// first device collective: rank 0 makes the backend's unique id and every
// rank receives it through a host allgather over the same group (with every
// rank's device and argument check), so split, dup and concurrent
// communicators never mix ids. Each collective is enqueued on the caller's
// stream (or the communicator's own), followed by an event; the Request
// completes when the event has. A process-wide watchdog polls pending work,
// the backend's asynchronous error and each collective's deadline; on an
// error or a hung peer it fails every pending request of the communicator
// naming the cause, then aborts the device communicator (later device
// collectives on it fail; host collectives keep working).
//
// Mismatches: each device collective takes the next collective number, as a
// host collective does, and sends a descriptor (its signature, no body) to
// the next rank, fire-and-forget, while it receives the previous rank's. A
// rank that called something else at that number meets the descriptor in
// its mailbox (rank_mailbox.h, kDescriptorStep): a host collective's receive
// fails there, a device call's descriptor receive fails here; either way the
// collective is aborted on every rank and the device communicators with it.
//
// Thread-safe.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor.h"
#include "core/collectives/device_work.h"  // the DeviceWork a device Request holds

namespace castmesh::detail {
class CommGroup;
}  // namespace castmesh::detail

namespace castmesh::collectives {

// True when either view is CUDA/ROCm memory: the collective takes the device path.
bool on_device(const TensorView& a, const TensorView& b);

// The device collectives behind Communicator's calls (same arguments). Each
// returns at once; errors, local or from the backend, are in the Request.
Request device_allreduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                         const DeviceOptions& options);
Request device_reduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                      int root, const DeviceOptions& options);
Request device_broadcast(detail::CommGroup& group, const TensorView& data, int root, const DeviceOptions& options);
Request device_allgather(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                         const DeviceOptions& options);
Request device_gather(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                      const DeviceOptions& options);
Request device_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                       const DeviceOptions& options);
Request device_reduce_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                              const ReduceSpec& op, const DeviceOptions& options);
Request device_alltoall(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                        const DeviceOptions& options);

// The error for a device buffer `what` given to host-only operation `op`
// (point to point: tags, any-source and probe have no device equivalent).
absl::Status host_only(const TensorView& t, absl::string_view what, absl::string_view op);

}  // namespace castmesh::collectives
