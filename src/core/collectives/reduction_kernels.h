// The tables of built-in reduction kernels behind castmesh::Reduction: one
// entry per (op, dtype) pair, filled where the pair is valid. There is one
// table per instruction set the library was compiled for (the portable one,
// and on x86-64 one for AVX2 + F16C); Reduction::Builtin takes its kernels
// from the best table the CPU runs, chosen once per process.
//
// Internal to the core (and its tests). Any thread.
#pragma once

#include <cstddef>

#include "castmesh/dtype.h"
#include "castmesh/reduce_op.h"

namespace castmesh::reduction_kernels {

// out[i] = lhs[i] op rhs[i]; out may be lhs, rhs, or both.
using KernelFn = void (*)(const void* lhs, const void* rhs, void* out, size_t count);
// avg's last step: divide by the number of contributions (>= 2).
using FinalizeFn = void (*)(void* data, size_t count, int contributions);

inline constexpr size_t kNumOps = static_cast<size_t>(ReduceOp::kLxor) + 1;
inline constexpr size_t kNumDTypes = static_cast<size_t>(DType::kBool) + 1;

// The kernels of one (op, dtype) pair; both null where the pair is invalid,
// finalize null for every op but avg.
struct Entry {
  KernelFn combine;
  FinalizeFn finalize;
};

// Indexed [op][dtype] by the enums' values. Plain arrays on purpose: the
// table is built in translation units compiled for different instruction
// sets, which must not share any inline function (see reduction_loops.h).
struct KernelTable {
  const char* isa;  // "portable", "avx2+f16c"
  Entry at[kNumOps][kNumDTypes];
};

// Why `op` makes no sense on `t`, or nullptr where it does. Every table has a
// kernel exactly where this returns nullptr.
constexpr const char* invalid_reason(ReduceOp op, DType t) {
  const bool logical = op == ReduceOp::kLand || op == ReduceOp::kLor || op == ReduceOp::kLxor;
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (logical) return nullptr;
  if (t == DType::kBool) {
    if (bitwise) return nullptr;
    return "bool takes only the logical ops (land, lor, lxor) and the bitwise ones (band, bor, bxor), as in MPI";
  }
  if (bitwise && dtype_is_float(t)) return "bitwise ops need an integer or bool dtype, not a floating one";
  if (op == ReduceOp::kAvg && !dtype_is_float(t)) return "avg needs a floating dtype; use sum";
  return nullptr;
}

// Kernels for the target's baseline instruction set (SSE2 on x86-64);
// compiled everywhere.
const KernelTable& portable_kernels();

// Kernels compiled for AVX2 with F16C conversions (x86-64 with GCC or Clang
// only), or nullptr where the library has none or this CPU (and OS) cannot
// run them.
const KernelTable* avx2_kernels();

#if defined(CASTMESH_REDUCTION_AVX2)
// The table itself, in reduction_kernels_avx2.cc; call avx2_kernels().
extern const KernelTable kAvx2KernelTable;
#endif

// The table Reduction::Builtin uses: the best one this CPU runs, unless the
// environment variable CASTMESH_REDUCTION_ISA=portable asks for the portable
// one (read once, at the first call).
const KernelTable& active_kernels();

}  // namespace castmesh::reduction_kernels
