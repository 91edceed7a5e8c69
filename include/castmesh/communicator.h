// Communicator: MPI-style point-to-point messages and collectives among the
// ranks of a group: the members of an actor mesh (row-major order), a
// sub-group of them (along, split), or the processes of an SPMD program
// started by a launcher (world). docs/collectives.md.
//
//   // inside a handler of an actor of an ActorMesh:
//   castmesh::Communicator comm = *castmesh::Communicator::current();
//   TensorView grads = ...;
//   CASTMESH_CHECK_OK(comm.allreduce(grads, grads, castmesh::ReduceOp::kSum));
//   castmesh::Communicator row = *comm.along({"gpus"});   // peers that differ only in "gpus"
//
// Semantics follow MPI: every rank calls the same collectives in the same
// order (a rank that calls another collective, count, dtype, op or root
// gets an error naming both sides, and so do the others, instead of a hang
// or garbage); point-to-point messages from one source with one tag arrive
// in the order sent (non-overtaking); kAnySource / kAnyTag match anything.
// Each rank's result of a reduction is bit-identical to every other rank's.
// A rank whose proc dies fails every pending operation that involves it on
// the other ranks, naming it.
//
// Data paths: ranks in one process exchange by a single memory copy; ranks
// in other procs through the procs' transport connection. Algorithms by
// size: binomial trees and recursive doubling for small messages, pipelined
// rings for large ones.
//
// Threading: a Communicator is a cheap handle (copy it freely) and may be
// used from any thread of its rank; blocking calls block the calling thread
// (messages are received by the transport's I/O threads, so a blocked rank
// never stops others from progressing). Non-blocking calls return a Request
// at once; their data must stay valid and untouched until it completes.
// Blocking inside a pooled actor holds a scheduler worker: an in-process
// mesh with more members than workers should give its members dedicated
// threads (see docs/collectives.md).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/reduction.h"
#include "castmesh/shape.h"
#include "castmesh/tensor.h"
#include "castmesh/tensor_engine.h"

namespace castmesh {

// The collectives' private state, named here only as the private members of
// the handles below; user code cannot make or reach one.
namespace detail {
class CommGroup;
class RequestState;
class DeviceWork;
}  // namespace detail
namespace collectives_internal {
class Handles;  // the collectives' factory of Request and Communicator handles
}  // namespace collectives_internal

// recv/irecv/probe: match a message from any source / with any tag.
inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;
// split(): a rank passing this color gets no communicator (MPI_UNDEFINED).
inline constexpr int kUndefined = -32766;

// What a completed receive or a probe matched (MPI_Status). Plain value.
struct MessageStatus {
  int source = -1;
  int tag = -1;
  size_t bytes = 0;
};

// A user-defined reduction for collectives: fn(in, inout, count, dtype)
// computes inout[i] = in[i] op inout[i], `in` holding lower ranks' data.
// When !commutative, ranks are combined in rank order.
struct CustomReduceOp {
  std::string name;
  ReduceFn fn;
  bool commutative = true;
};

// The operator of a reduction: a built-in ReduceOp or a CustomReduceOp.
// Plain value, implicitly built from either.
class ReduceSpec {
 public:
  ReduceSpec(ReduceOp op) : builtin_(op) {}  // NOLINT: implicit on purpose
  ReduceSpec(CustomReduceOp op) : custom_(std::make_shared<CustomReduceOp>(std::move(op))) {}  // NOLINT
  // The reduction on `dtype`; kInvalidArgument where the op makes no sense.
  absl::StatusOr<Reduction> on(DType dtype) const;
  // "sum", or the custom op's name.
  std::string name() const;
  // The built-in op, or nullopt for a custom one.
  std::optional<ReduceOp> builtin() const;

 private:
  ReduceOp builtin_ = ReduceOp::kSum;
  std::shared_ptr<const CustomReduceOp> custom_;
};

// A non-blocking operation in flight. Copies share the operation. Any thread.
class Request {
 public:
  // A request that is already complete (OK).
  Request();

  // Blocks until the operation completes or `timeout` passes
  // (kDeadlineExceeded; the operation stays pending and may be waited on
  // again). Receives return what they matched.
  absl::StatusOr<MessageStatus> wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  // The result if complete, nullopt while pending. Never blocks.
  std::optional<absl::StatusOr<MessageStatus>> test() const;
  // Device work (a collective on device buffers): work enqueued on `stream`
  // after this call runs after the operation, without blocking the CPU (an
  // event record + stream wait). A host operation is waited for here. Any
  // thread; the request's own error, if it already failed.
  absl::Status wait_stream(const DeviceStream& stream) const;
  // Waits for every request; the first error (in list order), else OK.
  static absl::Status wait_all(const std::vector<Request>& requests,
                               absl::Duration timeout = absl::InfiniteDuration());
  // Waits until one request completes and returns its index
  // (kDeadlineExceeded after `timeout`; kInvalidArgument for an empty list).
  static absl::StatusOr<size_t> wait_any(const std::vector<Request>& requests,
                                         absl::Duration timeout = absl::InfiniteDuration());

 private:
  friend class Communicator;
  friend class collectives_internal::Handles;
  explicit Request(std::shared_ptr<detail::RequestState> state) : state_(std::move(state)) {}
  // A collective on device buffers: `device` orders streams after it.
  Request(std::shared_ptr<detail::RequestState> state, std::shared_ptr<detail::DeviceWork> device)
      : state_(std::move(state)), device_(std::move(device)) {}

  std::shared_ptr<detail::RequestState> state_;
  std::shared_ptr<detail::DeviceWork> device_;  // null for host operations
};

// How a collective on device (CUDA/ROCm) buffers runs; host buffers ignore
// it. The blocking calls enqueue the same way and then wait on the CPU.
// Plain value.
struct DeviceOptions {
  // The stream the collective is enqueued on, after the work already there;
  // a default DeviceStream: the communicator's own stream on that device.
  DeviceStream stream;
  // The watchdog fails a collective (and every other pending one of the
  // communicator) and aborts the device communicator when it has not
  // completed this long after it was enqueued: a peer hung or died.
  absl::Duration timeout = absl::Minutes(10);
};

// How Communicator::world() finds its peers. Plain value.
struct WorldOptions {
  // Where rank 0 listens and the others join (tcp:HOST:PORT or
  // unix:PATH|@NAME). Empty: CASTMESH_RENDEZVOUS, else an abstract Unix
  // address derived from the launcher's job id (one host only).
  std::string rendezvous;
  // The job's shared secret. Empty: CASTMESH_SECRET, else derived from the
  // launcher's job id (one host only; set a secret for real deployments).
  std::string secret;
  absl::Duration join_timeout = absl::Seconds(60);
};

// A group of ranks and this rank's place in it. See the top of this file.
class Communicator {
 public:
  // The communicator of the actor mesh whose handler is running on this
  // thread (ranks in row-major order of the mesh). kFailedPrecondition
  // outside a mesh member's handler.
  static absl::StatusOr<Communicator> current();
  // The communicator of every process of an SPMD job started by a launcher
  // (mpirun, srun, a Kubernetes indexed Job): rank and size from the
  // launcher's variables, peers found through a rendezvous led by rank 0.
  // The first call sets up this process's runtime; later calls return it.
  static absl::StatusOr<Communicator> world(WorldOptions options = {});

  // This rank (0..size-1) and the number of ranks.
  int rank() const;
  int size() const;
  // The shape of the ranks (the mesh's, or {ranks: size} after a split).
  const Shape& shape() const;
  // Names the group; equal on every rank, unique per group.
  const std::string& id() const;

  // The ranks that differ from this one only in the dimensions `dims`
  // (row-major over them). No messages are exchanged.
  absl::StatusOr<Communicator> along(const std::vector<std::string>& dims) const;
  // MPI_Comm_split: ranks with one color form a group ordered by (key,
  // rank); kUndefined gives nullopt. Collective over this communicator.
  absl::StatusOr<std::optional<Communicator>> split(int color, int key) const;
  // A communicator of the same ranks whose messages never match this
  // one's. Collective.
  absl::StatusOr<Communicator> dup() const;

  // ---- point to point (data: contiguous CPU tensors; bytes are what match;
  // device buffers get Unimplemented: stage them to the host) ----
  absl::Status send(const TensorView& data, int dest, int tag = 0) const;
  Request isend(const TensorView& data, int dest, int tag = 0) const;
  // Receives into `out`; a message larger than out.nbytes() fails (kOutOfRange).
  absl::StatusOr<MessageStatus> recv(const TensorView& out, int source = kAnySource, int tag = kAnyTag,
                                     absl::Duration timeout = absl::InfiniteDuration()) const;
  Request irecv(const TensorView& out, int source = kAnySource, int tag = kAnyTag) const;
  // Waits until a matching message is there and describes it (not received).
  absl::StatusOr<MessageStatus> probe(int source = kAnySource, int tag = kAnyTag,
                                      absl::Duration timeout = absl::InfiniteDuration()) const;
  // A matching message if one is there now.
  std::optional<MessageStatus> iprobe(int source = kAnySource, int tag = kAnyTag) const;

  // ---- collectives (every rank calls each one, in the same order) ----
  // In-place: pass the same tensor as `in` and `out`. Buffers on a CUDA/ROCm
  // device go to the tensor_engine backend (NCCL/RCCL), enqueued as
  // `device` says; every rank then passes device buffers (docs/collectives.md).
  absl::Status barrier() const;
  Request ibarrier() const;
  // out = op over every rank's `in` (same count and dtype everywhere).
  absl::Status allreduce(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                         const DeviceOptions& device = {}) const;
  Request iallreduce(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                     const DeviceOptions& device = {}) const;
  // Like allreduce, but only `root`'s out is written.
  absl::Status reduce(const TensorView& in, const TensorView& out, const ReduceSpec& op, int root,
                      const DeviceOptions& device = {}) const;
  Request ireduce(const TensorView& in, const TensorView& out, const ReduceSpec& op, int root,
                  const DeviceOptions& device = {}) const;
  // root's `data` is copied into every other rank's `data`.
  absl::Status broadcast(const TensorView& data, int root, const DeviceOptions& device = {}) const;
  Request ibroadcast(const TensorView& data, int root, const DeviceOptions& device = {}) const;
  // out (size x in) holds every rank's `in`, by rank.
  absl::Status allgather(const TensorView& in, const TensorView& out, const DeviceOptions& device = {}) const;
  Request iallgather(const TensorView& in, const TensorView& out, const DeviceOptions& device = {}) const;
  // Like allgather, but only `root`'s out is written.
  absl::Status gather(const TensorView& in, const TensorView& out, int root, const DeviceOptions& device = {}) const;
  Request igather(const TensorView& in, const TensorView& out, int root, const DeviceOptions& device = {}) const;
  // Block r of root's `in` (size x out) goes to rank r's out.
  absl::Status scatter(const TensorView& in, const TensorView& out, int root, const DeviceOptions& device = {}) const;
  Request iscatter(const TensorView& in, const TensorView& out, int root, const DeviceOptions& device = {}) const;
  // Block r of the reduction of every rank's `in` (size x out) goes to rank r.
  absl::Status reduce_scatter(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                              const DeviceOptions& device = {}) const;
  Request ireduce_scatter(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                          const DeviceOptions& device = {}) const;
  // Block j of rank i's `in` goes to block i of rank j's `out`.
  absl::Status alltoall(const TensorView& in, const TensorView& out, const DeviceOptions& device = {}) const;
  Request ialltoall(const TensorView& in, const TensorView& out, const DeviceOptions& device = {}) const;

 private:
  friend class collectives_internal::Handles;
  // A handle of `group` (counted among its user handles).
  explicit Communicator(std::shared_ptr<detail::CommGroup> group);

  std::shared_ptr<detail::CommGroup> group_;
};

// Body bytes this process's collectives and point-to-point messages moved
// by each data path since it started, for tests and tuning (docs/hosts.md:
// peers on different hosts never use the first two). Plain value.
struct DataPathBytes {
  uint64_t shared_memory = 0;  // sent through same-host shared-memory rings
  uint64_t single_copy = 0;    // read straight from a same-host sender's memory
  uint64_t socket = 0;         // sent over the proc connection
};
// The counters now. Any thread.
DataPathBytes data_path_bytes();

}  // namespace castmesh
