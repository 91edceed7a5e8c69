// Test data shared by the RDMA buffer tests (rdma_buffer_test, the FakeNic
// tests): patterned bytes that say where they came from, and a message of
// comma-separated integers for the owner actors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "castmesh/tensor.h"

namespace castmesh::rdma_test {

// Byte i of a buffer filled with `seed`.
inline uint8_t pattern(size_t i, int seed) { return static_cast<uint8_t>(i * 131 + seed * 17 + (i >> 12)); }

// `size` bytes of pattern(0.., seed).
inline TensorView filled(size_t size, int seed) {
  TensorView t = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < size; ++i) p[i] = pattern(i, seed);
  return t;
}

// "" when bytes [0, length) of `data` are pattern(offset + i, seed), else the first difference.
inline std::string mismatch(const void* data, size_t offset, size_t length, int seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < length; ++i) {
    if (p[i] != pattern(offset + i, seed)) {
      return absl::StrCat("byte ", i, " is ", int{p[i]}, ", expected ", int{pattern(offset + i, seed)});
    }
  }
  return "";
}

// A message of integers ("a,b,c" on the wire); each test binary registers
// its codec with CASTMESH_REGISTER_MESSAGE(Numbers, ..., encode_numbers, decode_numbers).
struct Numbers {
  std::vector<int64_t> values;
};
inline absl::Status encode_numbers(const Numbers& m, std::string* out) {
  *out = absl::StrJoin(m.values, ",");
  return absl::OkStatus();
}
inline absl::Status decode_numbers(std::string_view bytes, Numbers* m) {
  m->values.clear();
  if (bytes.empty()) return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(absl::string_view(bytes.data(), bytes.size()), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) return absl::InvalidArgumentError("bad Numbers");
    m->values.push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace castmesh::rdma_test
