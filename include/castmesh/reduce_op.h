// ReduceOp: the built-in reduction operators of the data plane, on their own
// so that headers that only name an op (signatures, tables) need nothing else.
// Their use is in castmesh/reduction.h. Pure values; any thread.
#pragma once

#include <cstdint>

namespace castmesh {

// The built-in reduction operators (MPI_SUM ... MPI_LXOR, plus avg as in
// torch.distributed's ReduceOp.AVG).
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg, kBand, kBor, kBxor, kLand, kLor, kLxor };

// Every ReduceOp, in declaration order (for tests and tables).
inline constexpr ReduceOp kAllReduceOps[] = {
    ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,  ReduceOp::kMax, ReduceOp::kAvg,  ReduceOp::kBand,
    ReduceOp::kBor, ReduceOp::kBxor, ReduceOp::kLand, ReduceOp::kLor, ReduceOp::kLxor,
};

}  // namespace castmesh
