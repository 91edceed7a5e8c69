// Names for native code addresses of this process: the object file and
// its exported symbol from the dynamic linker (dladdr), demangled; and,
// when binutils' `addr2line` is on PATH, the function (also static ones)
// and the source file and line from the objects' symbol and debug
// sections, one addr2line run per object, bounded in time.
//
// Threading: thread-safe; blocks its caller (for addr2line) up to the
// given bound.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace castmesh::debug {

// One address, resolved as far as possible. Plain value.
struct Symbol {
  std::string function;  // demangled; empty: unknown
  std::string object;    // the file of the executable or shared object; empty: unknown
  uint64_t offset = 0;   // the address relative to the object's load base (what addr2line takes)
  std::string file;      // source file; empty: unknown
  int line = 0;          // 0: unknown
};

// Resolves `pcs`. For a return address (every frame but the innermost one
// of a stack) pass `return_address`: the call instruction before it is
// looked up, so the line is the call's. `file_lines`: run addr2line (when
// it is on PATH) for functions and lines, for at most `budget` in all.
std::vector<Symbol> symbolize(const std::vector<uintptr_t>& pcs, const std::vector<bool>& return_address,
                              bool file_lines, absl::Duration budget);

// "_ZN3foo3barEv" -> "foo::bar()"; the input if it is not a mangled name.
std::string demangle(std::string_view name);

}  // namespace castmesh::debug
