// Piece reducers (py_reducers.h): registered at static initialisation of
// the extension module, which every worker proc loads, so their cast relays
// can fold with them.
#include "py_reducers.h"

#include <atomic>
#include <cstring>
#include <string>
#include <utility>


namespace castmesh::python {
namespace {

enum class Op { kSum, kMin, kMax };

constexpr char kInt = 'I';
constexpr char kFloat = 'F';
constexpr char kList = 'L';
constexpr size_t kNumberSize = 1 + 8;

std::atomic<uint64_t> g_folds{0};

template <typename T>
T read_number(std::string_view piece) {
  static_assert(sizeof(T) == 8);
  uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = (bits << 8) | static_cast<unsigned char>(piece[1 + i]);
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

template <typename T>
std::string write_number(char tag, T value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  std::string out(kNumberSize, '\0');
  out[0] = tag;
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

bool is_number(std::string_view piece, char tag) { return piece.size() == kNumberSize && piece[0] == tag; }

// Appends `piece` to a list body: its items when it is a list, else itself.
void append_items(std::string& list, std::string_view piece) {
  if (!piece.empty() && piece[0] == kList) {
    list.append(piece.substr(1));
    return;
  }
  const auto n = static_cast<uint32_t>(piece.size());
  for (int i = 0; i < 4; ++i) list.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  list.append(piece);
}

// What Python's `op(a, b)` gives for two numbers of one kind (builtins min
// and max keep the left operand unless the right one is strictly smaller or
// larger), or a list of both when C++ cannot give exactly that.
template <Op op>
std::string fold(std::string a, std::string b) {
  if (is_number(a, kInt) && is_number(b, kInt)) {
    const auto x = read_number<int64_t>(a);
    const auto y = read_number<int64_t>(b);
    int64_t r = 0;
    bool ok = true;
    if constexpr (op == Op::kSum) ok = !__builtin_add_overflow(x, y, &r);
    if constexpr (op == Op::kMin) r = y < x ? y : x;
    if constexpr (op == Op::kMax) r = x < y ? y : x;
    if (ok) {
      g_folds.fetch_add(1, std::memory_order_relaxed);
      return write_number(kInt, r);
    }
  } else if (is_number(a, kFloat) && is_number(b, kFloat)) {
    const auto x = read_number<double>(a);
    const auto y = read_number<double>(b);
    double r = 0;
    if constexpr (op == Op::kSum) r = x + y;
    if constexpr (op == Op::kMin) r = y < x ? y : x;
    if constexpr (op == Op::kMax) r = x < y ? y : x;
    g_folds.fetch_add(1, std::memory_order_relaxed);
    return write_number(kFloat, r);
  }
  std::string list(1, kList);
  append_items(list, a);
  append_items(list, b);
  return list;
}

constexpr std::string_view kSumName = "castmesh.python.sum";
constexpr std::string_view kMinName = "castmesh.python.min";
constexpr std::string_view kMaxName = "castmesh.python.max";

CASTMESH_REGISTER_REDUCER(std::string, std::string(kSumName), fold<Op::kSum>);
CASTMESH_REGISTER_REDUCER(std::string, std::string(kMinName), fold<Op::kMin>);
CASTMESH_REGISTER_REDUCER(std::string, std::string(kMaxName), fold<Op::kMax>);

}  // namespace

absl::StatusOr<Reducer<std::string>> piece_reducer(std::string_view op) {
  if (op == "sum") return reducers::registered<std::string>(kSumName);
  if (op == "min") return reducers::registered<std::string>(kMinName);
  if (op == "max") return reducers::registered<std::string>(kMaxName);
  return absl::NotFoundError("no C++ reducer for '" + std::string(op) + "' (known: sum, min, max)");
}

uint64_t piece_folds() { return g_folds.load(std::memory_order_relaxed); }

}  // namespace castmesh::python
