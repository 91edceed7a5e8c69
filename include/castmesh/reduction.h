// Reductions of the data plane: the element-wise operators that allreduce,
// reduce and reduce_scatter apply to contributions of different ranks
// (docs/collectives.md). A Reduction is chosen once per call (op + dtype, or a
// user-defined function) and then combines whole buffers with a vectorised
// kernel; float16/bfloat16 are computed in float32.
//
// Operand order follows MPI: `in`/`lhs` holds the contribution of the LOWER
// ranks. It only matters for a non-commutative user-defined reduction, but the
// Communicator passes operands this way for every reduction so that all ranks
// compute bit-identical results.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "castmesh/dtype.h"
#include "castmesh/reduce_op.h"

namespace castmesh {

// Lower-case name: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor",
// "land", "lor", "lxor"; "?" for a value outside the enum.
std::string_view reduce_op_name(ReduceOp op);

// The ReduceOp named `name` (exactly as reduce_op_name prints it), if any.
std::optional<ReduceOp> reduce_op_from_name(std::string_view name);

// A user-defined reduction: inout[i] = in[i] (op) inout[i] for i < count,
// `in` holding the lower ranks' contribution (MPI's convention). It may be
// called on any slice of a buffer, from any thread, concurrently.
using ReduceFn = std::function<void(const void* in, void* inout, size_t count, DType dtype)>;

// A reduction ready to run on one dtype: built-in or user-defined. Copyable,
// immutable, and safe to use from any number of threads at once (a custom
// ReduceFn must itself be safe to call concurrently).
class Reduction {
 public:
  // The built-in `op` on `dtype`, or kInvalidArgument naming both where the
  // pair makes no sense: band/bor/bxor on floating dtypes; avg on integers and
  // bool (it needs a floating dtype; use sum); sum/prod/min/max/avg on bool
  // (use land/lor/lxor, as in MPI). land/lor/lxor work on every dtype
  // (nonzero is true, NaN included; the result is 0 or 1 in that dtype).
  static absl::StatusOr<Reduction> Builtin(ReduceOp op, DType dtype);

  // A user-defined reduction called `name`. `commutative` = false makes the
  // Communicator keep the rank order of operands (MPI_Op_create's flag). `fn`
  // must not be empty; it is never given one buffer as both `in` and `inout`.
  static Reduction Custom(std::string name, ReduceFn fn, bool commutative, DType dtype);

  // The element type this reduction runs on.
  DType dtype() const { return dtype_; }
  // False only for a user-defined reduction created non-commutative.
  bool commutative() const { return commutative_; }
  // reduce_op_name(op) for a built-in, the user's name otherwise.
  std::string name() const;
  // The built-in operator, or nullopt for a user-defined reduction.
  std::optional<ReduceOp> op() const { return op_; }

  // inout[i] = in[i] op inout[i] for i < count. `in` is the contribution of
  // the LOWER ranks. `in` and `inout` are the same buffer or do not overlap.
  void combine(const void* in, void* inout, size_t count) const;

  // out[i] = lhs[i] op rhs[i] for i < count, lhs being the lower ranks.
  // `out` may be the same buffer as lhs or rhs (or both); otherwise none of
  // the three may overlap.
  void combine3(const void* lhs, const void* rhs, void* out, size_t count) const;

  // Called once on the complete reduction of `contributions` buffers: avg
  // divides by that count (float16/bfloat16 through float32); every other op,
  // and a count below 2, leaves the data as it is.
  void finalize(void* data, size_t count, int contributions) const;

 private:
  struct CustomOp;
  // A built-in's kernels, picked from a table indexed by (op, dtype) once in
  // Builtin() (src/core/collectives/reduction_kernels.h).
  using Kernel = void (*)(const void* lhs, const void* rhs, void* out, size_t count);
  using Finalizer = void (*)(void* data, size_t count, int contributions);
  Reduction() = default;

  DType dtype_ = DType::kFloat32;
  bool commutative_ = true;
  std::optional<ReduceOp> op_;
  Kernel kernel_ = nullptr;
  Finalizer finalizer_ = nullptr;
  std::shared_ptr<const CustomOp> custom_;
};

// Conversions used by the kernels and by tests. Narrowing rounds to nearest,
// ties to even (overflow becomes infinity); a NaN stays a NaN with its sign
// and high payload bits, quiet after narrowing. Any thread.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace castmesh
