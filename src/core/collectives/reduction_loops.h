// The loops of the built-in reduction kernels, and the table that holds
// them. Included once per instruction set: by reduction.cc (the portable
// table) and by reduction_kernels_avx2.cc (compiled with -mavx2 -mf16c), both
// at -O3 in every build type so that the loops are auto-vectorised.
//
// Everything here is in an anonymous namespace and calls no inline function
// of another header (builtins instead of std::bit_cast/std::isnan): each
// translation unit keeps its own copy. A shared (COMDAT) copy of an inline
// function compiled with AVX2 could otherwise be the one the linker keeps,
// and run on a CPU without AVX2.
//
// How the loops stay vectorisable: every element function is branch-free
// (selects, no calls), pointers are restrict-qualified, and aliasing between
// output and inputs is decided once per call, outside the loop. float16 and
// bfloat16 are widened to float32 a block at a time into stack buffers,
// combined there, and rounded back; the conversions are selects between
// candidate encodings so that they vectorise too (F16C's instructions where
// the translation unit is compiled for them). Both files are compiled with
// -fno-trapping-math: without it GCC will not compute the float arithmetic of
// both sides of a select, and leaves the float16 conversions scalar. Results
// are unchanged (it only gives up exact FP exception flags), and no file is
// compiled with FMA, so no a*b+c is contracted: every table gives the same
// bits (NaN payloads aside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/collectives/reduction_kernels.h"

namespace castmesh::reduction_kernels {
namespace {

// ---- float16 / bfloat16 <-> float32 ----------------------------------------

// IEEE binary16 -> binary32; exact. Each class of input (zero/subnormal,
// normal, inf/NaN) has its own candidate, then two selects pick one.
inline float half_to_float_inline(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  // Magnitudes are compared as int32 (they fit): SSE2 and AVX2 have signed
  // 32-bit compares only, an unsigned one costs extra instructions.
  const int32_t mag = h & 0x7fff;
  const uint32_t bits = static_cast<uint32_t>(mag) << 13;
  // Exponent bias 15 -> 127: shift into place and add 112 << 23.
  const uint32_t normal = bits + 0x38000000u;
  // Exponent all ones stays all ones; the payload keeps its position.
  const uint32_t special = bits | 0x7f800000u;
  // A subnormal half is mantissa * 2^-24, a normal float32 (exact).
  const uint32_t subnormal = __builtin_bit_cast(uint32_t, static_cast<float>(mag) * 0x1p-24f);
  uint32_t r = mag >= 0x7c00 ? special : normal;
  r = mag < 0x0400 ? subnormal : r;
  return __builtin_bit_cast(float, r | sign);
}

// binary32 -> binary16, round to nearest, ties to even; overflow -> inf; NaN
// -> quiet NaN keeping sign and the top 9 payload bits.
inline uint16_t float_to_half_inline(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t umag = u & 0x7fffffffu;
  const int32_t mag = static_cast<int32_t>(umag);  // compared signed, as above
  // Normal result: rebias (-112 << 23), then drop 13 bits rounding to nearest
  // even (add 0xfff plus the bit that will become the last one kept). A carry
  // into the exponent is the correct result, up to and including infinity.
  const uint32_t normal = (umag - 0x38000000u + 0x0fffu + ((umag >> 13) & 1u)) >> 13;
  // Below 2^-14 the result is subnormal, a multiple of 2^-24. Adding 0.5,
  // whose ulp is 2^-24, makes the FPU do that rounding (to nearest even); the
  // bits above 0.5's are the half's mantissa (0x400 = the smallest normal).
  const uint32_t subnormal = __builtin_bit_cast(uint32_t, __builtin_bit_cast(float, umag) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((umag >> 13) & 0x03ffu);
  uint32_t r = mag < 0x38800000 ? subnormal : normal;
  r = mag >= 0x47800000 ? 0x7c00u : r;  // 2^16 and above (inf included)
  r = mag > 0x7f800000 ? nan : r;
  return static_cast<uint16_t>(r | sign);
}

// bfloat16 is the top half of a binary32.
inline float bfloat16_to_float_inline(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round to nearest, ties to even; NaN -> quiet NaN with
// sign and top payload bits. A NaN is truncated instead of rounded (the
// rounding add could carry it into inf or the sign), with the quiet bit set;
// written with masks rather than a select, which vectorises better.
inline uint16_t float_to_bfloat16_inline(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  const uint32_t is_nan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000 ? ~0u : 0u;
  const uint32_t bias = (0x7fffu + ((u >> 16) & 1u)) & ~is_nan;
  return static_cast<uint16_t>(((u + bias) >> 16) | (is_nan & 0x0040u));
}

// A 16-bit float format: how to widen, narrow, and what 1 and "nonzero" are.
struct Half {
  static float decode(uint16_t v) { return half_to_float_inline(v); }
  static uint16_t encode(float f) { return float_to_half_inline(f); }
  static constexpr uint16_t kOne = 0x3c00;
};
struct BFloat16 {
  static float decode(uint16_t v) { return bfloat16_to_float_inline(v); }
  static uint16_t encode(float f) { return float_to_bfloat16_inline(f); }
  static constexpr uint16_t kOne = 0x3f80;
};

// ---- element functions ------------------------------------------------------

// Integer sum/prod are done in an unsigned type at least as wide as int, so
// they wrap modulo 2^bits instead of overflowing (and int16 * int16 does not
// overflow `int` after promotion).
template <typename T>
using WideUnsigned = std::conditional_t<(sizeof(T) <= 4), uint32_t, uint64_t>;

// lhs op rhs for one element of an arithmetic type (bool is stored as uint8).
// Branch-free so that loops over it vectorise.
template <ReduceOp kOp, typename T>
inline T apply(T a, T b) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    if constexpr (kFloat) {
      return a + b;
    } else {
      return static_cast<T>(static_cast<WideUnsigned<T>>(a) + static_cast<WideUnsigned<T>>(b));
    }
  } else if constexpr (kOp == ReduceOp::kProd) {
    if constexpr (kFloat) {
      return a * b;
    } else {
      return static_cast<T>(static_cast<WideUnsigned<T>>(a) * static_cast<WideUnsigned<T>>(b));
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    // std::min(a, b) (a on ties), but a NaN on either side wins, as in torch.
    if constexpr (kFloat) {
      return (b < a || __builtin_isnan(b)) ? b : a;
    } else {
      return b < a ? b : a;
    }
  } else if constexpr (kOp == ReduceOp::kMax) {
    if constexpr (kFloat) {
      return (a < b || __builtin_isnan(b)) ? b : a;
    } else {
      return a < b ? b : a;
    }
  } else if constexpr (kOp == ReduceOp::kBand) {
    return static_cast<T>(a & b);
  } else if constexpr (kOp == ReduceOp::kBor) {
    return static_cast<T>(a | b);
  } else if constexpr (kOp == ReduceOp::kBxor) {
    return static_cast<T>(a ^ b);
  } else if constexpr (kOp == ReduceOp::kLand) {
    return static_cast<T>((a != T(0)) & (b != T(0)));
  } else if constexpr (kOp == ReduceOp::kLor) {
    return static_cast<T>((a != T(0)) | (b != T(0)));
  } else {
    static_assert(kOp == ReduceOp::kLxor);
    return static_cast<T>((a != T(0)) ^ (b != T(0)));
  }
}

// Logical ops on a 16-bit float, on its bits: nonzero means any bit but the
// sign set (so NaN is true, -0 false); true is F::kOne.
template <ReduceOp kOp, typename F>
inline uint16_t apply_logical_bits(uint16_t a, uint16_t b) {
  const bool ta = (a & 0x7fffu) != 0;
  const bool tb = (b & 0x7fffu) != 0;
  bool r;
  if constexpr (kOp == ReduceOp::kLand) {
    r = ta & tb;
  } else if constexpr (kOp == ReduceOp::kLor) {
    r = ta | tb;
  } else {
    static_assert(kOp == ReduceOp::kLxor);
    r = ta ^ tb;
  }
  return r ? F::kOne : uint16_t{0};
}

// ---- loops ------------------------------------------------------------------

// out[i] = f(a[i], b[i]) with the aliasing of this call known to the compiler:
// one loop per case, each with restrict pointers, chosen before the loop.
template <typename T, typename Fn>
inline void loop3(const T* __restrict a, const T* __restrict b, T* __restrict out, size_t n, Fn f) {
  for (size_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}
template <typename T, typename Fn>
inline void loop_into_rhs(const T* __restrict a, T* __restrict io, size_t n, Fn f) {
  for (size_t i = 0; i < n; ++i) io[i] = f(a[i], io[i]);
}
template <typename T, typename Fn>
inline void loop_into_lhs(T* __restrict io, const T* __restrict b, size_t n, Fn f) {
  for (size_t i = 0; i < n; ++i) io[i] = f(io[i], b[i]);
}
template <typename T, typename Fn>
inline void loop_self(T* io, size_t n, Fn f) {
  for (size_t i = 0; i < n; ++i) io[i] = f(io[i], io[i]);
}

template <typename T, typename Fn>
inline void elementwise(const void* lhs, const void* rhs, void* out, size_t n, Fn f) {
  const T* a = static_cast<const T*>(lhs);
  const T* b = static_cast<const T*>(rhs);
  T* o = static_cast<T*>(out);
  if (out == lhs && out == rhs) {
    loop_self(o, n, f);
  } else if (out == rhs) {
    loop_into_rhs(a, o, n, f);
  } else if (out == lhs) {
    loop_into_lhs(o, b, n, f);
  } else {
    loop3(a, b, o, n, f);
  }
}

// Elements of a 16-bit float widened per block (the two float32 blocks are
// 512 bytes). Measured on the reduction benchmark (bench/RESULTS.md): 64 gave
// float16 with F16C 35 GB/s where 256 gave 11 and 128 gave 30; bfloat16 was
// within noise of 128 and 256.
inline constexpr size_t kBlock = 64;

// The length of a block: FullBlock (a compile-time constant, so the loops
// below are compiled for exactly that trip count, without epilogues, whether
// or not the compiler inlines them) or a size_t for the last, partial block.
// Our own type rather than std::integral_constant, whose conversion operator
// would be an inline function shared with other translation units.
struct FullBlock {
  constexpr operator size_t() const { return kBlock; }
};

#if defined(__F16C__) && defined(__AVX__)
// With F16C the CPU converts 8 halves per instruction (vcvtph2ps/vcvtps2ph,
// round to nearest even: the same results as the portable code). A partial
// last group goes through an 8-lane scratch register too.
inline constexpr bool kHardwareHalf = true;

template <typename N>
inline void decode_halves(const uint16_t* __restrict src, float* __restrict dst, N n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  if (i < n) {
    alignas(16) uint16_t h[8] = {};
    alignas(32) float f[8];
    __builtin_memcpy(h, src + i, (n - i) * sizeof(uint16_t));
    _mm256_store_ps(f, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
    __builtin_memcpy(dst + i, f, (n - i) * sizeof(float));
  }
}

template <typename N>
inline void encode_halves(const float* __restrict src, uint16_t* __restrict dst, N n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
  }
  if (i < n) {
    alignas(32) float f[8] = {};
    alignas(16) uint16_t h[8];
    __builtin_memcpy(f, src + i, (n - i) * sizeof(float));
    _mm_store_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(_mm256_load_ps(f), kRound));
    __builtin_memcpy(dst + i, h, (n - i) * sizeof(uint16_t));
  }
}
#else
inline constexpr bool kHardwareHalf = false;
#endif

template <typename F, typename N>
inline void decode_block(const uint16_t* __restrict src, float* __restrict dst, N n) {
  if constexpr (kHardwareHalf && std::is_same_v<F, Half>) {
    decode_halves(src, dst, n);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = F::decode(src[i]);
  }
}

template <typename F, typename N>
inline void encode_block(const float* __restrict src, uint16_t* __restrict dst, N n) {
  if constexpr (kHardwareHalf && std::is_same_v<F, Half>) {
    encode_halves(src, dst, n);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = F::encode(src[i]);
  }
}

template <ReduceOp kOp, typename N>
inline void apply_block(const float* __restrict a, float* __restrict b, N n) {
  for (size_t i = 0; i < n; ++i) b[i] = apply<kOp, float>(a[i], b[i]);
}

// One block of a 16-bit float kernel. Both inputs are read in full before
// `out` is written, so `out` may be either input.
template <ReduceOp kOp, typename F, typename N>
inline void fp16_block(const uint16_t* a, const uint16_t* b, uint16_t* out, N n) {
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  decode_block<F>(a, fa, n);
  decode_block<F>(b, fb, n);
  apply_block<kOp>(fa, fb, n);
  encode_block<F>(fb, out, n);
}

// ---- kernels ------------------------------------------------------------------

template <ReduceOp kOp, typename T>
void kernel(const void* lhs, const void* rhs, void* out, size_t n) {
  elementwise<T>(lhs, rhs, out, n, [](T a, T b) { return apply<kOp, T>(a, b); });
}

template <ReduceOp kOp, typename F>
void fp16_kernel(const void* lhs, const void* rhs, void* out, size_t n) {
  if constexpr (kOp == ReduceOp::kLand || kOp == ReduceOp::kLor || kOp == ReduceOp::kLxor) {
    elementwise<uint16_t>(lhs, rhs, out, n, [](uint16_t a, uint16_t b) { return apply_logical_bits<kOp, F>(a, b); });
  } else {
    const auto* a = static_cast<const uint16_t*>(lhs);
    const auto* b = static_cast<const uint16_t*>(rhs);
    auto* o = static_cast<uint16_t*>(out);
    size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) fp16_block<kOp, F>(a + i, b + i, o + i, FullBlock{});
    if (i < n) fp16_block<kOp, F>(a + i, b + i, o + i, n - i);
  }
}

// avg's last step: divide by the number of contributions (exactly rounded
// division, the same on every rank).
template <typename T>
void divide(void* data, size_t n, int contributions) {
  T* __restrict p = static_cast<T*>(data);
  const T d = static_cast<T>(contributions);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <typename F>
void fp16_divide(void* data, size_t n, int contributions) {
  auto* p = static_cast<uint16_t*>(data);
  const float d = static_cast<float>(contributions);
  alignas(64) float buf[kBlock];
  auto divide_block = [&](uint16_t* block, auto m) {
    decode_block<F>(block, buf, m);
    for (size_t j = 0; j < m; ++j) buf[j] = buf[j] / d;
    encode_block<F>(buf, block, m);
  };
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) divide_block(p + i, FullBlock{});
  if (i < n) divide_block(p + i, n - i);
}

// ---- the table ------------------------------------------------------------------

// The storage type of each DType, in DType order (float16 and bfloat16 as
// their bits, bool as a byte).
using StorageTypes = std::tuple<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uint16_t,
                                uint16_t, float, double, uint8_t>;
template <DType kT>
using Storage = std::tuple_element_t<static_cast<size_t>(kT), StorageTypes>;
static_assert(std::is_same_v<Storage<DType::kFloat32>, float> && std::is_same_v<Storage<DType::kBool>, uint8_t>);

template <ReduceOp kOp, DType kT>
constexpr Entry make_entry() {
  if constexpr (invalid_reason(kOp, kT) != nullptr) {
    return {nullptr, nullptr};
  } else if constexpr (kT == DType::kFloat16 || kT == DType::kBFloat16) {
    using F = std::conditional_t<kT == DType::kFloat16, Half, BFloat16>;
    return {&fp16_kernel<kOp, F>, kOp == ReduceOp::kAvg ? &fp16_divide<F> : nullptr};
  } else {
    using T = Storage<kT>;
    if constexpr (kOp == ReduceOp::kAvg) {
      return {&kernel<kOp, T>, &divide<T>};
    } else {
      return {&kernel<kOp, T>, nullptr};
    }
  }
}

template <size_t... kOps, size_t... kTs>
constexpr KernelTable make_table(const char* isa, std::index_sequence<kOps...>, std::index_sequence<kTs...>) {
  KernelTable table{isa, {}};
  auto row = [&]<size_t kOp>(std::integral_constant<size_t, kOp>) {
    ((table.at[kOp][kTs] = make_entry<static_cast<ReduceOp>(kOp), static_cast<DType>(kTs)>()), ...);
  };
  (row(std::integral_constant<size_t, kOps>{}), ...);
  return table;
}

// The kernels of every pair, compiled for this translation unit's ISA.
constexpr KernelTable make_kernel_table(const char* isa) {
  return make_table(isa, std::make_index_sequence<kNumOps>{}, std::make_index_sequence<kNumDTypes>{});
}

}  // namespace
}  // namespace castmesh::reduction_kernels
