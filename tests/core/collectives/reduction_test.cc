// Reduction: every (op, dtype) pair against a scalar reference written
// independently of the kernels (a switch per element), on lengths around the
// vector and block widths, unaligned, with every aliasing the API allows;
// invalid pairs and their messages; user-defined reductions and their operand
// order; float16/bfloat16 conversions against an exact reference built from
// double arithmetic.
#include "castmesh/reduction.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/collectives/reduction_kernels.h"

namespace castmesh {
namespace {

// ---- reference conversions --------------------------------------------------

// The value of an IEEE-style binary format's bits, exactly, as a double.
double decode_ref(uint32_t bits, int exp_bits, int mant_bits) {
  const uint32_t mant = bits & ((1u << mant_bits) - 1);
  const uint32_t exp = (bits >> mant_bits) & ((1u << exp_bits) - 1);
  const bool neg = (bits >> (mant_bits + exp_bits)) & 1u;
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (exp == (1u << exp_bits) - 1) {
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<double>(mant | (1u << mant_bits)), static_cast<int>(exp) - bias - mant_bits);
  }
  return neg ? -v : v;
}

// A finite float rounded to the format (to nearest, ties to even), encoded.
// Built from frexp/nearbyint in double: exact, since every scaling below is by
// a power of two and a float has fewer bits than a double.
uint32_t encode_ref(float f, int exp_bits, int mant_bits) {
  const uint32_t sign = std::signbit(f) ? 1u << (exp_bits + mant_bits) : 0u;
  const double a = std::fabs(static_cast<double>(f));
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int min_exp = 1 - bias;  // exponent of the smallest normal
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int unit_exp = std::max(e - 1, min_exp) - mant_bits;
  const double q = std::nearbyint(std::ldexp(a, -unit_exp));  // units of the last place
  const double r = std::ldexp(q, unit_exp);
  if (a == 0 || r == 0) return sign;
  if (r >= std::ldexp(1.0, bias + 1)) return sign | (((1u << exp_bits) - 1) << mant_bits);  // inf
  int re;
  std::frexp(r, &re);
  if (re - 1 < min_exp) return sign | static_cast<uint32_t>(std::ldexp(r, bias - 1 + mant_bits));  // subnormal
  const uint32_t exp = static_cast<uint32_t>(re - 1 + bias);
  const uint32_t mant = static_cast<uint32_t>(std::ldexp(r, -(re - 1) + mant_bits)) & ((1u << mant_bits) - 1);
  return sign | (exp << mant_bits) | mant;
}

bool half_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

TEST(HalfConversion, EveryHalfWidensExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    const double ref = decode_ref(h, 5, 10);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
      // The payload moves up unchanged, so narrowing gives the same NaN back
      // (made quiet).
      ASSERT_EQ(float_to_half(f), h | 0x0200u) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), ref) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
      ASSERT_EQ(float_to_half(f), h) << "round trip of " << std::hex << h;
    }
  }
}

TEST(HalfConversion, NarrowingMatchesExactRounding) {
  // Every exponent and sign, with the 13 bits that get rounded away set to
  // each interesting pattern (exact, below/at/above the tie) and the kept
  // bits both even and odd.
  const uint32_t low_patterns[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
  for (uint32_t high = 0; high < (1u << 19); high += 3) {
    for (uint32_t low : low_patterns) {
      const uint32_t bits = (high << 13) | low;
      const float f = std::bit_cast<float>(bits);
      const uint16_t h = float_to_half(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(half_is_nan(h)) << std::hex << bits;
        ASSERT_EQ(h & 0x8000u, (bits >> 16) & 0x8000u);
      } else if (std::isinf(f)) {
        ASSERT_EQ(h, f > 0 ? 0x7c00u : 0xfc00u);
      } else {
        ASSERT_EQ(h, encode_ref(f, 5, 10)) << std::hex << bits << " = " << f;
      }
    }
  }
}

TEST(HalfConversion, EdgeCases) {
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)) && half_to_float(0x7c00) > 0);
  EXPECT_TRUE(std::isinf(half_to_float(0xfc00)) && half_to_float(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // signalling
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)) && half_to_float(0x8000) == 0.0f);

  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // tie with 2^16: to even, i.e. inf
  EXPECT_EQ(float_to_half(1e9f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e9f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0: even
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2 ulps: even
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_half(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(float_to_half(-std::ldexp(1.0f, -30)), 0x8000);    // underflow keeps the sign
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_TRUE(half_is_nan(float_to_half(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload lives only in the low bits stays a NaN.
  EXPECT_TRUE(half_is_nan(float_to_half(std::bit_cast<float>(0x7f800001u))));
  EXPECT_EQ(float_to_half(std::bit_cast<float>(0xff800001u)) & 0x8000u, 0x8000u);
}

TEST(BFloat16Conversion, EveryBFloat16WidensExactly) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bfloat16_to_float(static_cast<uint16_t>(b));
    const double ref = decode_ref(b, 8, 7);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_EQ(float_to_bfloat16(f), b | 0x0040u) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(f), ref) << std::hex << b;
      ASSERT_EQ(float_to_bfloat16(f), b) << std::hex << b;
    }
  }
}

TEST(BFloat16Conversion, NarrowingMatchesExactRounding) {
  const uint32_t low_patterns[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000};
  for (uint32_t high = 0; high <= 0xffff; ++high) {
    for (uint32_t low : low_patterns) {
      const uint32_t bits = (high << 16) | low;
      const float f = std::bit_cast<float>(bits);
      const uint16_t b = float_to_bfloat16(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(bf16_is_nan(b)) << std::hex << bits;
        ASSERT_EQ(b & 0x8000u, high & 0x8000u);
      } else if (std::isinf(f)) {
        ASSERT_EQ(b, f > 0 ? 0x7f80u : 0xff80u);
      } else {
        ASSERT_EQ(b, encode_ref(f, 8, 7)) << std::hex << bits << " = " << f;
      }
    }
  }
}

TEST(BFloat16Conversion, EdgeCases) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // overflow to inf
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x007fffffu)), 0x0080);  // up into the normals
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  // NaNs that the rounding add would carry into inf or zero stay NaNs.
  EXPECT_TRUE(bf16_is_nan(float_to_bfloat16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(bf16_is_nan(float_to_bfloat16(std::bit_cast<float>(0x7fffffffu))));
  EXPECT_TRUE(bf16_is_nan(float_to_bfloat16(std::bit_cast<float>(0xffffffffu))));
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bfloat16_to_float(0x0001), std::bit_cast<float>(0x00010000u));  // subnormal
}

// ---- names and validation ----------------------------------------------------

TEST(ReduceOpNames, RoundTrip) {
  const char* expected[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor", "lxor"};
  ASSERT_EQ(std::size(kAllReduceOps), std::size(expected));
  for (size_t i = 0; i < std::size(kAllReduceOps); ++i) {
    EXPECT_EQ(reduce_op_name(kAllReduceOps[i]), expected[i]);
    EXPECT_EQ(reduce_op_from_name(expected[i]), kAllReduceOps[i]);
  }
  EXPECT_EQ(reduce_op_from_name("SUM"), std::nullopt);
  EXPECT_EQ(reduce_op_from_name(""), std::nullopt);
  EXPECT_EQ(reduce_op_from_name("mean"), std::nullopt);
  EXPECT_EQ(reduce_op_name(static_cast<ReduceOp>(200)), "?");
}

bool is_logical(ReduceOp op) { return op == ReduceOp::kLand || op == ReduceOp::kLor || op == ReduceOp::kLxor; }
bool is_bitwise(ReduceOp op) { return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor; }

// The rule of the API, restated: which pairs must be accepted.
bool pair_is_valid(ReduceOp op, DType t) {
  if (is_logical(op)) return true;
  if (t == DType::kBool) return is_bitwise(op);
  if (is_bitwise(op)) return !dtype_is_float(t);
  if (op == ReduceOp::kAvg) return dtype_is_float(t);
  return true;
}

TEST(ReductionBuiltin, AcceptsExactlyTheValidPairs) {
  int valid = 0;
  for (ReduceOp op : kAllReduceOps) {
    for (DType t : kAllDTypes) {
      absl::StatusOr<Reduction> r = Reduction::Builtin(op, t);
      const std::string pair = std::string(reduce_op_name(op)) + " on " + std::string(dtype_name(t));
      if (pair_is_valid(op, t)) {
        ++valid;
        ASSERT_TRUE(r.ok()) << pair << ": " << r.status();
        EXPECT_EQ(r->op(), op);
        EXPECT_EQ(r->dtype(), t);
        EXPECT_EQ(r->name(), reduce_op_name(op));
        EXPECT_TRUE(r->commutative());
      } else {
        ASSERT_FALSE(r.ok()) << pair;
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << pair;
        const std::string msg(r.status().message());
        EXPECT_NE(msg.find(std::string(reduce_op_name(op))), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::string(dtype_name(t))), std::string::npos) << msg;
      }
    }
  }
  EXPECT_EQ(valid, 118);  // 8 integer dtypes x 10, 4 floating x 8, bool x 6
}

// Every table has kernels exactly for the valid pairs, and a finalizer for
// avg only; Builtin uses the best table this CPU runs.
TEST(ReductionTables, CoverTheValidPairs) {
  std::vector<const reduction_kernels::KernelTable*> tables = {&reduction_kernels::portable_kernels()};
  if (reduction_kernels::avx2_kernels() != nullptr) tables.push_back(reduction_kernels::avx2_kernels());
  for (const reduction_kernels::KernelTable* table : tables) {
    for (ReduceOp op : kAllReduceOps) {
      for (DType t : kAllDTypes) {
        const reduction_kernels::Entry& e = table->at[static_cast<size_t>(op)][static_cast<size_t>(t)];
        EXPECT_EQ(e.combine != nullptr, pair_is_valid(op, t))
            << table->isa << " " << reduce_op_name(op) << " " << dtype_name(t);
        EXPECT_EQ(e.finalize != nullptr, pair_is_valid(op, t) && op == ReduceOp::kAvg) << table->isa;
      }
    }
  }
  const char* forced = std::getenv("CASTMESH_REDUCTION_ISA");
  const bool portable_forced = forced != nullptr && std::string(forced) == "portable";
  EXPECT_EQ(&reduction_kernels::active_kernels(), portable_forced || tables.size() == 1 ? tables[0] : tables[1]);
  std::printf("reduction kernels in use: %s\n", reduction_kernels::active_kernels().isa);
}

std::string error_of(ReduceOp op, DType t) {
  absl::StatusOr<Reduction> r = Reduction::Builtin(op, t);
  return r.ok() ? "ok" : std::string(r.status().message());
}

TEST(ReductionBuiltin, InvalidPairsSayWhy) {
  EXPECT_EQ(error_of(ReduceOp::kAvg, DType::kInt32),
            "reduction avg is not defined on int32: avg needs a floating dtype; use sum");
  EXPECT_EQ(error_of(ReduceOp::kBxor, DType::kFloat16),
            "reduction bxor is not defined on float16: bitwise ops need an integer or bool dtype, not a floating one");
  EXPECT_NE(error_of(ReduceOp::kSum, DType::kBool).find("bool takes only the logical ops"), std::string::npos);
  EXPECT_NE(error_of(ReduceOp::kAvg, DType::kBool).find("reduction avg is not defined on bool"), std::string::npos);
  EXPECT_NE(error_of(static_cast<ReduceOp>(42), DType::kFloat32).find("unknown reduction op 42"), std::string::npos);
  EXPECT_NE(error_of(ReduceOp::kSum, static_cast<DType>(99)).find("unknown dtype 99"), std::string::npos);
}

// ---- kernels against the reference ---------------------------------------------

template <typename T>
T ref_int(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::kProd:
      return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kBand:
      return static_cast<T>(a & b);
    case ReduceOp::kBor:
      return static_cast<T>(a | b);
    case ReduceOp::kBxor:
      return static_cast<T>(a ^ b);
    case ReduceOp::kLand:
      return (a != 0 && b != 0) ? 1 : 0;
    case ReduceOp::kLor:
      return (a != 0 || b != 0) ? 1 : 0;
    case ReduceOp::kLxor:
      return ((a != 0) != (b != 0)) ? 1 : 0;
    case ReduceOp::kAvg:
      break;
  }
  ADD_FAILURE() << "no integer reference for " << reduce_op_name(op);
  return 0;
}

// Floating ops in the type's own precision; a NaN operand of min/max wins.
template <typename T>
T ref_float(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return std::min(a, b);
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return std::max(a, b);
    case ReduceOp::kLand:
      return (a != 0 && b != 0) ? 1 : 0;
    case ReduceOp::kLor:
      return (a != 0 || b != 0) ? 1 : 0;
    case ReduceOp::kLxor:
      return ((a != 0) != (b != 0)) ? 1 : 0;
    default:
      break;
  }
  ADD_FAILURE() << "no floating reference for " << reduce_op_name(op);
  return 0;
}

// One element of the reference, on raw storage.
void ref_element(ReduceOp op, DType t, const unsigned char* a, const unsigned char* b, unsigned char* out) {
  auto typed = [&]<typename T>(T* /*tag*/, auto fn) {
    T x, y;
    std::memcpy(&x, a, sizeof(T));
    std::memcpy(&y, b, sizeof(T));
    T r = fn(x, y);
    std::memcpy(out, &r, sizeof(T));
  };
  auto ints = [&]<typename T>(T* tag) { typed(tag, [&](T x, T y) { return ref_int<T>(op, x, y); }); };
  auto narrow = [&](float (*widen)(uint16_t), uint16_t (*round)(float)) {
    typed(static_cast<uint16_t*>(nullptr),
          [&](uint16_t x, uint16_t y) { return round(ref_float<float>(op, widen(x), widen(y))); });
  };
  switch (t) {
    case DType::kInt8:
      return ints(static_cast<int8_t*>(nullptr));
    case DType::kInt16:
      return ints(static_cast<int16_t*>(nullptr));
    case DType::kInt32:
      return ints(static_cast<int32_t*>(nullptr));
    case DType::kInt64:
      return ints(static_cast<int64_t*>(nullptr));
    case DType::kUInt8:
      return ints(static_cast<uint8_t*>(nullptr));
    case DType::kUInt16:
      return ints(static_cast<uint16_t*>(nullptr));
    case DType::kUInt32:
      return ints(static_cast<uint32_t*>(nullptr));
    case DType::kUInt64:
      return ints(static_cast<uint64_t*>(nullptr));
    case DType::kBool:
      return ints(static_cast<uint8_t*>(nullptr));
    case DType::kFloat32:
      return typed(static_cast<float*>(nullptr), [&](float x, float y) { return ref_float<float>(op, x, y); });
    case DType::kFloat64:
      return typed(static_cast<double*>(nullptr), [&](double x, double y) { return ref_float<double>(op, x, y); });
    case DType::kFloat16:
      return narrow(&half_to_float, &float_to_half);
    case DType::kBFloat16:
      return narrow(&bfloat16_to_float, &float_to_bfloat16);
  }
}

bool element_is_nan(DType t, const unsigned char* p) {
  switch (t) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return t == DType::kFloat16 ? half_is_nan(h) : bf16_is_nan(h);
    }
    default:
      return false;
  }
}

// A buffer of `n` elements with `kGuard` sentinel elements on both sides
// (kernels must not touch them) and an optional one-element offset so that
// the data is not vector-aligned.
class Buffer {
 public:
  static constexpr size_t kGuard = 3;
  Buffer(DType t, size_t n, size_t misalign)
      : n_(n), size_(dtype_size(t)), bytes_((n + 2 * kGuard + 1) * size_, 0xa5), start_(kGuard + misalign) {}
  unsigned char* data() { return bytes_.data() + start_ * size_; }
  const unsigned char* data() const { return bytes_.data() + start_ * size_; }
  unsigned char* at(size_t i) { return data() + i * size_; }
  const unsigned char* at(size_t i) const { return data() + i * size_; }
  size_t n() const { return n_; }
  bool guards_intact() const {
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if ((i < start_ * size_ || i >= (start_ + n_) * size_) && bytes_[i] != 0xa5) return false;
    }
    return true;
  }

 private:
  size_t n_;
  size_t size_;
  std::vector<unsigned char> bytes_;
  size_t start_;
};

// Values that exercise each dtype: random bits (wrapping, NaN, inf,
// subnormals), moderate numbers for floats, and zeros for the logical ops.
void fill(Buffer& buf, DType t, std::mt19937_64& rng) {
  const size_t size = dtype_size(t);
  for (size_t i = 0; i < buf.n(); ++i) {
    const uint64_t r = rng();
    uint64_t bits = rng();
    const unsigned kind = r % 8;
    if (t == DType::kBool) {
      bits = kind & 1;
    } else if (kind == 0) {
      bits = 0;
    } else if (kind == 1 && dtype_is_float(t)) {
      bits = uint64_t{1} << (size * 8 - 1);  // -0.0
    } else if (kind <= 4 && dtype_is_float(t)) {
      const float v = static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) / 4096.0f;
      if (t == DType::kFloat32) bits = std::bit_cast<uint32_t>(v);
      if (t == DType::kFloat64) bits = std::bit_cast<uint64_t>(static_cast<double>(v) * 1.000001);
      if (t == DType::kFloat16) bits = float_to_half(v / 64);
      if (t == DType::kBFloat16) bits = float_to_bfloat16(v);
    }
    std::memcpy(buf.at(i), &bits, size);  // little-endian: the low bytes
  }
}

// Checks buf[i] == reference(a[i], b[i]) for all i (any NaN matches a NaN).
void expect_reference(ReduceOp op, DType t, const Buffer& a, const Buffer& b, const Buffer& got,
                      const std::string& what) {
  const size_t size = dtype_size(t);
  std::vector<unsigned char> want(size);
  for (size_t i = 0; i < got.n(); ++i) {
    ref_element(op, t, a.at(i), b.at(i), want.data());
    if (element_is_nan(t, want.data()) && element_is_nan(t, got.at(i))) continue;
    if (std::memcmp(want.data(), got.at(i), size) != 0) {
      uint64_t wa = 0, wg = 0, xa = 0, xb = 0;
      std::memcpy(&wa, want.data(), size);
      std::memcpy(&wg, got.at(i), size);
      std::memcpy(&xa, a.at(i), size);
      std::memcpy(&xb, b.at(i), size);
      ADD_FAILURE() << what << ": element " << i << " of " << got.n() << ": " << std::hex << "lhs 0x" << xa << " rhs 0x"
                    << xb << " want 0x" << wa << " got 0x" << wg;
      return;
    }
  }
  EXPECT_TRUE(got.guards_intact()) << what << " wrote outside its buffer";
}

struct Pair {
  ReduceOp op;
  DType dtype;
};

std::vector<Pair> valid_pairs() {
  std::vector<Pair> pairs;
  for (ReduceOp op : kAllReduceOps) {
    for (DType t : kAllDTypes) {
      if (pair_is_valid(op, t)) pairs.push_back({op, t});
    }
  }
  return pairs;
}

class ReductionKernel : public ::testing::TestWithParam<Pair> {};

// Lengths: empty, one, odd ones shorter and longer than any vector, across
// the float16 block (256), and with a tail.
constexpr size_t kLengths[] = {0, 1, 7, 33, 257, 1000};

// avg's finalize on one element: the division in the dtype's precision
// (float16/bfloat16 through float32).
void ref_divide(DType t, const unsigned char* in, unsigned char* out, int n) {
  if (t == DType::kFloat32 || t == DType::kFloat64) {
    if (t == DType::kFloat32) {
      float f;
      std::memcpy(&f, in, 4);
      f /= static_cast<float>(n);
      std::memcpy(out, &f, 4);
    } else {
      double d;
      std::memcpy(&d, in, 8);
      d /= n;
      std::memcpy(out, &d, 8);
    }
    return;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  h = t == DType::kFloat16 ? float_to_half(half_to_float(h) / static_cast<float>(n))
                           : float_to_bfloat16(bfloat16_to_float(h) / static_cast<float>(n));
  std::memcpy(out, &h, 2);
}

// The kernels of one table entry, called the way Reduction calls them.
struct TableKernels {
  reduction_kernels::Entry entry;
  void combine(const void* in, void* inout, size_t n) const { entry.combine(in, inout, inout, n); }
  void combine3(const void* lhs, const void* rhs, void* out, size_t n) const { entry.combine(lhs, rhs, out, n); }
  void finalize(void* data, size_t n, int contributions) const {
    if (entry.finalize != nullptr) entry.finalize(data, n, contributions);
  }
};

// Runs `k` (a Reduction or a table's kernels) on every length, aligned and
// not, with every aliasing the API allows, against the reference.
template <typename K>
void check_against_reference(const K& k, ReduceOp op, DType t, const std::string& who) {
  std::mt19937_64 rng(static_cast<uint64_t>(op) * 131 + static_cast<uint64_t>(t));
  const size_t size = dtype_size(t);
  for (size_t n : kLengths) {
    for (size_t misalign : {0, 1}) {
      const std::string at = " (" + who + ", n=" + std::to_string(n) + (misalign ? ", unaligned)" : ")");
      Buffer a(t, n, misalign), b(t, n, misalign);
      fill(a, t, rng);
      fill(b, t, rng);
      const Buffer a0 = a, b0 = b;

      Buffer inout = b;  // combine: inout = a op inout
      k.combine(a.data(), inout.data(), n);
      expect_reference(op, t, a0, b0, inout, "combine" + at);

      Buffer out(t, n, misalign);
      k.combine3(a.data(), b.data(), out.data(), n);
      expect_reference(op, t, a0, b0, out, "combine3 into a third buffer" + at);

      Buffer into_rhs = b;
      k.combine3(a.data(), into_rhs.data(), into_rhs.data(), n);
      expect_reference(op, t, a0, b0, into_rhs, "combine3 with out = rhs" + at);

      Buffer into_lhs = a;
      k.combine3(into_lhs.data(), b.data(), into_lhs.data(), n);
      expect_reference(op, t, a0, b0, into_lhs, "combine3 with out = lhs" + at);

      Buffer self = a;
      k.combine3(self.data(), self.data(), self.data(), n);
      expect_reference(op, t, a0, a0, self, "combine3 with out = lhs = rhs" + at);

      Buffer self2 = b;
      k.combine(self2.data(), self2.data(), n);
      expect_reference(op, t, b0, b0, self2, "combine with in = inout" + at);

      // Inputs that are not the output are left alone.
      EXPECT_EQ(std::memcmp(a.data(), a0.data(), n * size), 0) << at;
      EXPECT_EQ(std::memcmp(b.data(), b0.data(), n * size), 0) << at;

      // Deterministic: the same call gives the same bits.
      Buffer again = b;
      k.combine(a.data(), again.data(), n);
      EXPECT_EQ(std::memcmp(again.data(), inout.data(), n * size), 0) << at;

      // finalize divides for avg and does nothing for the rest.
      Buffer fin = inout;
      k.finalize(fin.data(), n, 3);
      std::vector<unsigned char> want(size);
      for (size_t i = 0; i < n; ++i) {
        if (op == ReduceOp::kAvg) {
          ref_divide(t, inout.at(i), want.data(), 3);
        } else {
          std::memcpy(want.data(), inout.at(i), size);
        }
        if (element_is_nan(t, want.data()) && element_is_nan(t, fin.at(i))) continue;
        ASSERT_EQ(std::memcmp(fin.at(i), want.data(), size), 0) << "finalize, element " << i << at;
      }
      EXPECT_TRUE(fin.guards_intact()) << "finalize" << at;
    }
  }
}

// The public path (Reduction::Builtin picks the table this CPU runs best),
// then every table this CPU can run, each on its own.
TEST_P(ReductionKernel, MatchesReferenceWithEveryAliasing) {
  const auto [op, t] = GetParam();
  absl::StatusOr<Reduction> red = Reduction::Builtin(op, t);
  ASSERT_TRUE(red.ok()) << red.status();
  check_against_reference(*red, op, t, "Reduction");
  std::vector<const reduction_kernels::KernelTable*> tables = {&reduction_kernels::portable_kernels()};
  if (reduction_kernels::avx2_kernels() != nullptr) tables.push_back(reduction_kernels::avx2_kernels());
  for (const reduction_kernels::KernelTable* table : tables) {
    const reduction_kernels::Entry entry = table->at[static_cast<size_t>(op)][static_cast<size_t>(t)];
    ASSERT_NE(entry.combine, nullptr) << table->isa;
    check_against_reference(TableKernels{entry}, op, t, table->isa);
  }
}

std::string pair_name(const ::testing::TestParamInfo<Pair>& info) {
  return std::string(reduce_op_name(info.param.op)) + "_" + std::string(dtype_name(info.param.dtype));
}

INSTANTIATE_TEST_SUITE_P(AllPairs, ReductionKernel, ::testing::ValuesIn(valid_pairs()), pair_name);

// ---- particular semantics ------------------------------------------------------

template <typename T>
std::vector<T> combined(ReduceOp op, DType t, std::vector<T> lhs, std::vector<T> rhs) {
  absl::StatusOr<Reduction> r = Reduction::Builtin(op, t);
  EXPECT_TRUE(r.ok()) << r.status();
  r->combine(lhs.data(), rhs.data(), rhs.size());
  return rhs;
}

TEST(ReductionSemantics, IntegerSumAndProdWrap) {
  EXPECT_EQ(combined<int8_t>(ReduceOp::kSum, DType::kInt8, {127, -128}, {1, -1}), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(combined<int16_t>(ReduceOp::kProd, DType::kInt16, {-32768, 300}, {-1, 300}),
            (std::vector<int16_t>{-32768, static_cast<int16_t>(90000 - 65536)}));
  EXPECT_EQ(combined<uint16_t>(ReduceOp::kProd, DType::kUInt16, {65535}, {65535}), (std::vector<uint16_t>{1}));
  EXPECT_EQ(combined<int32_t>(ReduceOp::kSum, DType::kInt32, {std::numeric_limits<int32_t>::max()}, {1}),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(combined<int64_t>(ReduceOp::kProd, DType::kInt64, {std::numeric_limits<int64_t>::min()}, {-1}),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ(combined<uint64_t>(ReduceOp::kSum, DType::kUInt64, {~uint64_t{0}}, {2}), (std::vector<uint64_t>{1}));
}

TEST(ReductionSemantics, MinMaxPropagateNaNAndKeepLhsOnTies) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> mn =
      combined<float>(ReduceOp::kMin, DType::kFloat32, {nan, 1.0f, 2.0f, -0.0f}, {1.0f, nan, 1.0f, 0.0f});
  EXPECT_TRUE(std::isnan(mn[0]));
  EXPECT_TRUE(std::isnan(mn[1]));
  EXPECT_EQ(mn[2], 1.0f);
  EXPECT_TRUE(std::signbit(mn[3]));  // std::min(-0, +0) is its first argument
  std::vector<double> mx =
      combined<double>(ReduceOp::kMax, DType::kFloat64, {1.0, std::nan(""), 0.0}, {std::nan(""), 1.0, -0.0});
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_TRUE(std::isnan(mx[1]));
  EXPECT_FALSE(std::signbit(mx[2]));
  std::vector<uint16_t> h =
      combined<uint16_t>(ReduceOp::kMax, DType::kFloat16, {0x3c00, 0x7e00, 0xfc00}, {0x4000, 0x3c00, 0xc000});
  EXPECT_EQ(h[0], 0x4000);
  EXPECT_TRUE(half_is_nan(h[1]));
  EXPECT_EQ(h[2], 0xc000);
}

TEST(ReductionSemantics, LogicalOpsGiveZeroOrOne) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(combined<float>(ReduceOp::kLand, DType::kFloat32, {nan, -0.0f, 2.5f}, {3.0f, 1.0f, -1.0f}),
            (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(combined<int32_t>(ReduceOp::kLxor, DType::kInt32, {5, 0, -7, 0}, {9, 4, 0, 0}),
            (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(combined<uint16_t>(ReduceOp::kLor, DType::kFloat16, {0x8000, 0x0001, 0x0000}, {0x0000, 0x0000, 0x7e00}),
            (std::vector<uint16_t>{0x0000, 0x3c00, 0x3c00}));
  EXPECT_EQ(combined<uint16_t>(ReduceOp::kLand, DType::kBFloat16, {0x4000, 0x8000}, {0x0001, 0x3f80}),
            (std::vector<uint16_t>{0x3f80, 0x0000}));
  EXPECT_EQ(combined<uint8_t>(ReduceOp::kBxor, DType::kBool, {1, 1, 0}, {1, 0, 0}), (std::vector<uint8_t>{0, 1, 0}));
}

TEST(ReductionSemantics, HalfSumIsComputedInFloat32) {
  // 2048 + 1 is not representable in float16 (ulp 2 there): the float32 sum
  // 2049 rounds to even, 2048; 2048 + 3 = 2051 rounds to 2052.
  std::vector<uint16_t> r =
      combined<uint16_t>(ReduceOp::kSum, DType::kFloat16, {float_to_half(2048.0f), float_to_half(2048.0f)},
                         {float_to_half(1.0f), float_to_half(3.0f)});
  EXPECT_EQ(half_to_float(r[0]), 2048.0f);
  EXPECT_EQ(half_to_float(r[1]), 2052.0f);
  // 60000 + 60000 overflows float16 to inf.
  r = combined<uint16_t>(ReduceOp::kSum, DType::kFloat16, {float_to_half(60000.0f)}, {float_to_half(60000.0f)});
  EXPECT_EQ(r[0], 0x7c00);
}

TEST(ReductionSemantics, AvgDividesByContributionsInFinalize) {
  absl::StatusOr<Reduction> f32 = Reduction::Builtin(ReduceOp::kAvg, DType::kFloat32);
  ASSERT_TRUE(f32.ok());
  // Three ranks: (1 + 2) + 6, then / 3.
  std::vector<float> acc = {6.0f, 1.0f, -3.0f};
  std::vector<float> r1 = {1.0f, 1.0f, 0.0f}, r2 = {2.0f, 1.0f, 0.0f};
  f32->combine(r1.data(), r2.data(), 3);
  f32->combine(r2.data(), acc.data(), 3);
  f32->finalize(acc.data(), 3, 3);
  EXPECT_EQ(acc, (std::vector<float>{3.0f, 1.0f, -1.0f}));
  std::vector<float> unchanged = {5.0f};
  f32->finalize(unchanged.data(), 1, 1);
  f32->finalize(unchanged.data(), 1, 0);
  EXPECT_EQ(unchanged[0], 5.0f);

  absl::StatusOr<Reduction> bf = Reduction::Builtin(ReduceOp::kAvg, DType::kBFloat16);
  ASSERT_TRUE(bf.ok());
  std::vector<uint16_t> b(300, float_to_bfloat16(1.0f));  // crosses a block
  bf->finalize(b.data(), b.size(), 3);
  for (uint16_t v : b) ASSERT_EQ(v, float_to_bfloat16(1.0f / 3.0f));

  absl::StatusOr<Reduction> f64 = Reduction::Builtin(ReduceOp::kAvg, DType::kFloat64);
  ASSERT_TRUE(f64.ok());
  std::vector<double> d = {1.0, 7.0};
  f64->finalize(d.data(), 2, 7);
  EXPECT_EQ(d, (std::vector<double>{1.0 / 7.0, 1.0}));

  absl::StatusOr<Reduction> h = Reduction::Builtin(ReduceOp::kAvg, DType::kFloat16);
  ASSERT_TRUE(h.ok());
  std::vector<uint16_t> hv = {float_to_half(10.0f), 0x7c00};
  h->finalize(hv.data(), 2, 4);
  EXPECT_EQ(hv, (std::vector<uint16_t>{float_to_half(2.5f), 0x7c00}));
}

// ---- user-defined reductions -----------------------------------------------------

// A non-commutative op: inout = in * 10 + inout, so folding ranks 0..k in
// order writes their digits left to right. It also checks that it is never
// handed the same buffer twice.
Reduction digits_op(int* aliased_calls) {
  return Reduction::Custom(
      "digits",
      [aliased_calls](const void* in, void* inout, size_t count, DType dtype) {
        EXPECT_EQ(dtype, DType::kInt32);
        if (in == inout) ++*aliased_calls;
        const auto* a = static_cast<const int32_t*>(in);
        auto* b = static_cast<int32_t*>(inout);
        for (size_t i = 0; i < count; ++i) b[i] = a[i] * 10 + b[i];
      },
      /*commutative=*/false, DType::kInt32);
}

TEST(ReductionCustom, KeepsOperandOrder) {
  int aliased = 0;
  const Reduction r = digits_op(&aliased);
  EXPECT_EQ(r.name(), "digits");
  EXPECT_FALSE(r.commutative());
  EXPECT_EQ(r.op(), std::nullopt);
  EXPECT_EQ(r.dtype(), DType::kInt32);

  // Four ranks' contributions folded in rank order: 1, 2, 3, 4 -> 1234.
  std::vector<int32_t> acc = {1, 5};
  const std::vector<int32_t> r1 = {2, 6}, r2 = {3, 7}, r3 = {4, 8};
  r.combine3(acc.data(), r1.data(), acc.data(), 2);  // out = lhs
  r.combine3(acc.data(), r2.data(), acc.data(), 2);
  std::vector<int32_t> out(2);
  r.combine3(acc.data(), r3.data(), out.data(), 2);  // a third buffer
  EXPECT_EQ(out, (std::vector<int32_t>{1234, 5678}));

  std::vector<int32_t> hi = {9, 9};
  r.combine(out.data(), hi.data(), 2);  // in holds the lower ranks
  EXPECT_EQ(hi, (std::vector<int32_t>{12349, 56789}));

  std::vector<int32_t> rhs = {7};
  const std::vector<int32_t> lhs = {3};
  r.combine3(lhs.data(), rhs.data(), rhs.data(), 1);  // out = rhs
  EXPECT_EQ(rhs[0], 37);
  r.finalize(rhs.data(), 1, 4);
  EXPECT_EQ(rhs[0], 37);
  EXPECT_EQ(aliased, 0);
}

TEST(ReductionCustom, SameBufferOnBothSidesAndLongBuffers) {
  int aliased = 0;
  const Reduction r = digits_op(&aliased);
  // Longer than the chunk used when out is lhs (16 KiB).
  const size_t n = 10007;
  std::vector<int32_t> lhs(n), rhs(n);
  for (size_t i = 0; i < n; ++i) {
    lhs[i] = static_cast<int32_t>(i % 9);
    rhs[i] = static_cast<int32_t>((i * 7) % 10);
  }
  std::vector<int32_t> out = lhs;
  r.combine3(out.data(), rhs.data(), out.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], lhs[i] * 10 + rhs[i]) << i;

  std::vector<int32_t> self = lhs;
  r.combine3(self.data(), self.data(), self.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(self[i], lhs[i] * 11) << i;
  self = lhs;
  r.combine(self.data(), self.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(self[i], lhs[i] * 11) << i;
  EXPECT_EQ(aliased, 0);

  r.combine(nullptr, nullptr, 0);  // nothing to do, nothing called
}

TEST(ReductionCustom, CopiesShareTheFunction) {
  int calls = 0;
  Reduction r = Reduction::Custom(
      "count", [&calls](const void*, void*, size_t, DType) { ++calls; }, true, DType::kFloat64);
  Reduction copy = r;
  double a = 1, b = 2;
  copy.combine(&a, &b, 1);
  r.combine(&a, &b, 1);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(copy.commutative());
  EXPECT_EQ(copy.name(), "count");
}

// One Reduction used from several threads at once (TSan checks the claim of
// the header).
TEST(ReductionBuiltin, ConcurrentUse) {
  absl::StatusOr<Reduction> r = Reduction::Builtin(ReduceOp::kSum, DType::kBFloat16);
  ASSERT_TRUE(r.ok());
  const Reduction shared = *r;
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&shared, &ok, t] {
      std::vector<uint16_t> a(4096, float_to_bfloat16(static_cast<float>(t))), b(4096, float_to_bfloat16(1.0f));
      for (int k = 0; k < 10; ++k) shared.combine(a.data(), b.data(), a.size());
      ok[t] = std::all_of(b.begin(), b.end(),
                          [t](uint16_t v) { return v == float_to_bfloat16(1.0f + 10.0f * static_cast<float>(t)); });
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok, (std::vector<int>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace castmesh
