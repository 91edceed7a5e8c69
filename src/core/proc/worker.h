// Worker-side bootstrap shared by init()/run_worker() and the allocator.
#pragma once

#include <string>
#include <vector>

#include "castmesh/runtime.h"
#include "core/proc/launch_env.h"

namespace castmesh::proc {

// Serves as the worker described by `launch` (core/proc/launch_env.h) until
// its controller says Stop, disconnects or dies; returns the process exit
// code (non-zero when it could not join). Main thread.
int serve_worker(const WorkerLaunch& launch, RuntimeOptions runtime_options);

}  // namespace castmesh::proc
