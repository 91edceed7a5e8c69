// Which operating-system facilities the core uses: the one switch between the
// Linux-only fast paths and their portable POSIX fallbacks.
//
// CASTMESH_LINUX_FACILITIES is 1 on Linux unless the build sets
// CASTMESH_POSIX_FALLBACKS (CMake option of that name), which forces every
// fallback on Linux so that the fallbacks are compiled and tested here.
// Each facility makes its choice in exactly one file:
//   futex wait/wake            core/scheduler/futex.cc (fallback: core/scheduler/parking_lot.cc)
//   worker dies with controller core/proc/controller_lifeline.cc
//   own executable, argv, env   core/platform/process.cc
//   thread names               core/platform/process.cc
//   default Unix listen address core/transport/unix_socket_names.cc (abstract name | private folder)
//   Unix peer credentials       core/transport/unix_socket_names.cc
//   involuntary switches       core/platform/core_contention.cc (fallback: the process's count)
//   cross-memory attach         core/platform/process_memory.cc (fallback: the caller's transport)
//   coarse monotonic clock      core/transport/endpoint.cc (fallback: steady_clock)
//   prefaulted shared mappings  core/shm_link/shm_ring.cc (fallback: pages fault in on first use)
// Include only from .cc files of the core.
#pragma once

#if defined(__linux__) && !defined(CASTMESH_POSIX_FALLBACKS)
#define CASTMESH_LINUX_FACILITIES 1
#else
#define CASTMESH_LINUX_FACILITIES 0
#endif

namespace castmesh::platform {

// True when this build uses the Linux-only facilities (false on other
// systems and in a CASTMESH_POSIX_FALLBACKS build). For tests and logs.
bool uses_linux_facilities();

}  // namespace castmesh::platform
