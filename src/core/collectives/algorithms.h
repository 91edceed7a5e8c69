// The collective algorithms, over a CommGroup's send/receive primitives.
// Each runs one collective (number `sequence`, identified on the wire by
// `signature`) to completion on the calling thread; buffers are already
// validated (contiguous CPU memory, sizes agree). Small messages take the
// latency-optimal algorithm (binomial trees, recursive doubling), large
// ones the bandwidth-optimal one (rings, pipelined chains); reductions
// combine lower ranks' data on the left, so every rank's result is the
// same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "castmesh/reduction.h"
#include "core/collectives/comm_group.h"

namespace castmesh::collectives {

// One collective call on one rank: the group, its number and signature.
struct CollectiveCall {
  detail::CommGroup* group = nullptr;
  uint64_t sequence = 0;
  CallSignature signature;  // never null
};

// Below this many bytes the latency-optimal algorithms run.
inline constexpr size_t kSmallMessageBytes = 64 * 1024;
// Segment of a pipelined chain broadcast.
inline constexpr size_t kPipelineSegmentBytes = 256 * 1024;
// Segment of the pipelined ring allreduce (large messages): big enough to
// go by single copy between processes of a host (>= 64 KiB), small enough
// that a window of them stays in a core's L2.
inline constexpr size_t kAllreduceSegmentBytes = 256 * 1024;
// Reduce-scatter segments a rank has receives posted for at once.
inline constexpr size_t kAllreduceWindow = 4;
// Two ranks up to this size (above kSmallMessageBytes): each reads the
// peer's whole input and combines all of it, instead of the ring. Faster at
// 256 KiB and 1 MiB; at 4 MiB (segments beyond the posted window) it had
// calls of ~5 ms that the ring does not have (bench/RESULTS.md, issue 12).
inline constexpr size_t kTwoRankExchangeMaxBytes = size_t{1} << 20;

absl::Status run_barrier(const CollectiveCall& call);
absl::Status run_broadcast(const CollectiveCall& call, void* data, size_t bytes, int root);
// `out` holds `count` elements of the reduction (in may alias out).
absl::Status run_allreduce(const CollectiveCall& call, const void* in, void* out, size_t count,
                           const Reduction& op);
// Only root's `out` is written; others may pass null.
absl::Status run_reduce(const CollectiveCall& call, const void* in, void* out, size_t count, const Reduction& op,
                        int root);
// in: `bytes` per rank; out: size * bytes.
absl::Status run_allgather(const CollectiveCall& call, const void* in, void* out, size_t bytes);
absl::Status run_gather(const CollectiveCall& call, const void* in, void* out, size_t bytes, int root);
absl::Status run_scatter(const CollectiveCall& call, const void* in, void* out, size_t bytes, int root);
// in: size * count elements; out: count elements (block `rank` of the reduction).
absl::Status run_reduce_scatter(const CollectiveCall& call, const void* in, void* out, size_t count,
                                const Reduction& op);
// in, out: size blocks of `bytes`.
absl::Status run_alltoall(const CollectiveCall& call, const void* in, void* out, size_t bytes);

}  // namespace castmesh::collectives
