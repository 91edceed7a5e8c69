// Worker-side bootstrap shared by init()/run_worker() and the allocator.
#pragma once

#include <string>
#include <vector>

#include "castmesh/runtime.h"

namespace castmesh::proc {

// The argv given to castmesh::init (empty if it was not called). Main
// thread writes it once at start-up; read afterwards.
std::vector<std::string>& recorded_argv();

// Serves as the worker of the controller at `bootstrap` until it says Stop,
// disconnects or dies; returns the process exit code. Main thread.
int serve_worker(const std::string& bootstrap, RuntimeOptions runtime_options);

}  // namespace castmesh::proc
