// Worker-side bootstrap state shared with the allocator.
#pragma once

#include <string>
#include <vector>

namespace castmesh::proc {

// The argv given to castmesh::init (empty if it was not called). Main
// thread writes it once at start-up; read afterwards.
std::vector<std::string>& recorded_argv();

}  // namespace castmesh::proc
