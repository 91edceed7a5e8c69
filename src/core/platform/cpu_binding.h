// CPU binding of worker procs (HostMesh::spawn_procs' proc_bind): the host
// agent turns a mesh's binding into one CPU list per proc, handed to the
// proc in CASTMESH_CPU_BIND, and the proc binds itself before it starts
// any thread (so every thread inherits the mask). Any thread.
#pragma once

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace castmesh::platform {

// "0-3,8": the CPUs a worker proc binds itself to at start.
inline constexpr char kEnvCpuBind[] = "CASTMESH_CPU_BIND";

// Checks a binding: "" (none), "cores" (the host's i-th proc on its i-th
// allowed CPU, round robin) or CPU lists separated by ';' (the i-th proc
// gets the (i mod n)-th list). InvalidArgument naming what is wrong.
absl::Status check_proc_bind(absl::string_view spec);
// The CPU list of the host's proc `local_index` under `spec` ("" = none).
std::string cpu_binding_for(absl::string_view spec, size_t local_index);
// Binds the calling process (its calling thread, and every thread it starts
// later) to `cpus` ("0-3,8"). Unimplemented where the system cannot.
absl::Status bind_this_process(absl::string_view cpus);

}  // namespace castmesh::platform
