// Reduction: names, validation, and the two ways to combine (a built-in
// kernel from the table the CPU runs best, or a user function with MPI's
// operand convention). Also home of the portable kernel table: this file is
// compiled at -O3 in every build type (see CMakeLists.txt and
// reduction_loops.h).
#include "castmesh/reduction.h"

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>

#if defined(CASTMESH_REDUCTION_AVX2)
#include <cpuid.h>
#endif

#include "castmesh/config.h"
#include "core/collectives/reduction_kernels.h"
#include "core/collectives/reduction_loops.h"

namespace castmesh {

namespace rk = reduction_kernels;

// The tables are indexed by the enums' values: keep them dense and in order.
static_assert(std::size(kAllReduceOps) == rk::kNumOps);
static_assert(std::size(kAllDTypes) == rk::kNumDTypes);

namespace reduction_kernels {

namespace {
// Built at compile time: no code runs before main for it.
constexpr KernelTable kPortableKernels = make_kernel_table("portable");
}  // namespace

const KernelTable& portable_kernels() { return kPortableKernels; }

#if defined(CASTMESH_REDUCTION_AVX2)
namespace {
// AVX2 and F16C in CPUID, and the OS saving the YMM registers (XCR0 bits 1
// and 2). Clang 14's __builtin_cpu_supports does not know "f16c", so ask
// CPUID directly.
bool cpu_runs_avx2_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool osxsave = (ecx & bit_OSXSAVE) != 0, avx = (ecx & bit_AVX) != 0, f16c = (ecx & bit_F16C) != 0;
  if (!osxsave || !avx || !f16c) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return false;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ebx & bit_AVX2) != 0;
}
}  // namespace
#endif

const KernelTable* avx2_kernels() {
#if defined(CASTMESH_REDUCTION_AVX2)
  static const bool runs = cpu_runs_avx2_f16c();
  if (runs) return &kAvx2KernelTable;
#endif
  return nullptr;
}

const KernelTable& active_kernels() {
  static const KernelTable& table = []() -> const KernelTable& {
    if (config::global().reduction_isa == config::ReductionIsa::kPortable) return portable_kernels();
    const KernelTable* avx2 = avx2_kernels();
    return avx2 != nullptr ? *avx2 : portable_kernels();
  }();
  return table;
}

}  // namespace reduction_kernels

namespace {

constexpr std::string_view kOpNames[] = {"sum", "prod", "min",  "max", "avg", "band",
                                         "bor", "bxor", "land", "lor", "lxor"};
static_assert(std::size(kOpNames) == rk::kNumOps);

bool valid_op(ReduceOp op) { return static_cast<size_t>(op) < rk::kNumOps; }
bool valid_dtype(DType t) { return static_cast<size_t>(t) < rk::kNumDTypes; }

// Bytes a user-defined combine3 copies through at a time when `out` is
// `lhs` (the function can only write into its second operand).
constexpr size_t kCustomChunkBytes = 16 * 1024;

}  // namespace

// What a user-defined reduction owns; shared by every copy of the Reduction.
struct Reduction::CustomOp {
  std::string name;
  ReduceFn fn;
};

std::string_view reduce_op_name(ReduceOp op) {
  return valid_op(op) ? kOpNames[static_cast<size_t>(op)] : std::string_view("?");
}

std::optional<ReduceOp> reduce_op_from_name(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (reduce_op_name(op) == name) return op;
  }
  return std::nullopt;
}

absl::StatusOr<Reduction> Reduction::Builtin(ReduceOp op, DType dtype) {
  if (!valid_op(op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown reduction op ", static_cast<int>(op), " (valid: 0..", rk::kNumOps - 1, ")"));
  }
  if (!valid_dtype(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduction ", std::string(reduce_op_name(op)), " on an unknown dtype ", static_cast<int>(dtype)));
  }
  if (const char* why = rk::invalid_reason(op, dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("reduction ", std::string(reduce_op_name(op)), " is not defined on ",
                                                   std::string(dtype_name(dtype)), ": ", why));
  }
  const rk::Entry& entry = rk::active_kernels().at[static_cast<size_t>(op)][static_cast<size_t>(dtype)];
  Reduction r;
  r.dtype_ = dtype;
  r.op_ = op;
  r.kernel_ = entry.combine;
  r.finalizer_ = entry.finalize;
  return r;
}

Reduction Reduction::Custom(std::string name, ReduceFn fn, bool commutative, DType dtype) {
  Reduction r;
  r.dtype_ = dtype;
  r.commutative_ = commutative;
  r.custom_ = std::make_shared<const CustomOp>(CustomOp{std::move(name), std::move(fn)});
  return r;
}

std::string Reduction::name() const {
  if (custom_) return custom_->name;
  return std::string(reduce_op_name(*op_));
}

void Reduction::combine(const void* in, void* inout, size_t count) const {
  if (count == 0) return;
  if (kernel_ != nullptr) {
    kernel_(in, inout, inout, count);
  } else if (in != inout) {
    custom_->fn(in, inout, count, dtype_);
  } else {
    combine3(in, inout, inout, count);  // the user function gets two buffers
  }
}

void Reduction::combine3(const void* lhs, const void* rhs, void* out, size_t count) const {
  if (count == 0) return;
  if (kernel_ != nullptr) {
    kernel_(lhs, rhs, out, count);
    return;
  }
  // The user function writes into its second operand, the higher ranks'. It
  // is never handed the same buffer twice (MPI does not do that either).
  const size_t size = std::max<size_t>(dtype_size(dtype_), 1);
  if (out == rhs && out != lhs) {
    custom_->fn(lhs, out, count, dtype_);
  } else if (out != lhs) {
    std::memcpy(out, rhs, count * size);
    custom_->fn(lhs, out, count, dtype_);
  } else {
    // out is lhs: copy rhs aside a chunk at a time, combine there, copy back.
    // Element-wise, so any split gives the same result.
    alignas(64) unsigned char chunk[kCustomChunkBytes];
    const size_t per_chunk = kCustomChunkBytes / size;
    auto* o = static_cast<unsigned char*>(out);
    const auto* r = static_cast<const unsigned char*>(rhs);
    for (size_t i = 0; i < count; i += per_chunk) {
      const size_t n = std::min(per_chunk, count - i);
      std::memcpy(chunk, r + i * size, n * size);
      custom_->fn(o + i * size, chunk, n, dtype_);
      std::memcpy(o + i * size, chunk, n * size);
    }
  }
}

void Reduction::finalize(void* data, size_t count, int contributions) const {
  if (finalizer_ == nullptr || count == 0 || contributions < 2) return;
  finalizer_(data, count, contributions);
}

float half_to_float(uint16_t h) { return rk::half_to_float_inline(h); }
uint16_t float_to_half(float f) { return rk::float_to_half_inline(f); }
float bfloat16_to_float(uint16_t b) { return rk::bfloat16_to_float_inline(b); }
uint16_t float_to_bfloat16(float f) { return rk::float_to_bfloat16_inline(f); }

}  // namespace castmesh
