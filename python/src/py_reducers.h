// Reducers over the replies of Python endpoints, folded by the cast relays
// of the worker procs on the way up the cast tree (castmesh.Accumulator with
// operator.add, min or max).
//
// A reply to a reducing call is a *piece*: one tag byte, then
//   'I' an int64 (little-endian)      'F' a double (IEEE-754, little-endian)
//   'R' an ordinary reply (pickled)   'L' pieces of the other kinds, each
//                                         as a u32 little-endian length + piece
// Two numbers of one kind are folded in C++; anything else (another type,
// an error, an int64 overflow, int with float) is kept as a list that the
// caller folds with the Python function, so every value is folded exactly
// as Python would, only the order differs (row-major, tree-shaped).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "castmesh/value_mesh.h"

namespace castmesh::python {

// The registered reducer for `op` ("sum", "min" or "max") over pieces, or
// NotFound for another name. Any thread.
absl::StatusOr<Reducer<std::string>> piece_reducer(std::string_view op);

// How many numeric folds this process has done (all ops): a test counter,
// read with castmesh._castmesh.piece_folds(). Any thread.
uint64_t piece_folds();

}  // namespace castmesh::python
