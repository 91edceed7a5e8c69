// FAKE CUDA runtime and FAKE NCCL for the tensor_engine logic's unit tests:
// te_runtime_ops / te_nccl_ops tables backed by host memory and threads, so
// backends/tensor_engine/te_engine.c runs on machines without a GPU.
//
// FakeCuda: "device" memory is host memory (tracked, so a bad free is an
// error); each stream is a FIFO executor with its own thread (enqueued work
// runs in order, off the caller's thread, so ordering bugs show up); an event
// completes when the work its stream had before the record has drained.
// FakeNccl: communicators are in-process ranks (threads of the test) meeting
// in a "clique" keyed by the unique id; collectives run on the rank's stream
// thread, rendezvous with the other ranks and do real host-memory reductions.
// With CASTMESH_FAKE_TE_NCCL=shm (read by get_unique_id) the id names a
// shared-memory segment instead, where ranks in different processes of one
// host meet (collectives only, at most 8 ranks and 1 MiB per rank and call).
// Codes are the real cudaError_t / ncclResult_t values. Process-wide state:
// all entries are thread-safe.
#pragma once

#include <cstdint>
#include <functional>

#include "castmesh/backend_abi.h"
#include "te_ops.h"

// Thread-locals of the fakes. They are built into a plugin that is dlopen'd,
// where plain thread_local is dynamic TLS; LeakSanitizer's exit-time scan of
// the dynamic TLS of threads still running (the core's detached watchdog)
// crashed its tracer ("Tracer caught signal 11", in most ASan runs of
// AsyncErrorFailsPendingWorkAndAbortsTheCommunicator). Initial-exec puts
// these few bytes in glibc's static TLS surplus instead.
#define CASTMESH_FAKE_THREAD_LOCAL thread_local __attribute__((tls_model("initial-exec")))

namespace castmesh::fakes {

class FakeCuda {
 public:
  // The runtime table (vendor "FakeCUDA", 4 devices, 1 GiB per allocation at most).
  static const te_runtime_ops* ops();
  // The native handle of the most recent stream this thread created, to
  // enqueue kernel-like work on it with launch().
  static void* last_stream_created();
  // Enqueues `work` on a fake stream, as a kernel launch would.
  static void launch(void* stream, std::function<void()> work);
  // Device allocations alive now (to check frees).
  static int64_t live_device_allocations();
  // Copies of `kind` (castmesh_te_copy_kind_v1) enqueued so far in this process.
  static int64_t copies(int kind);
};

class FakeNccl {
 public:
  // The collective table.
  static const te_nccl_ops* ops();
  // A te_nccl_loader that yields ops() whatever the library name.
  static int load(const char* library, te_nccl_ops* ops, char* why, size_t why_size);
  // Simulates rank `rank` of communicator `id` dying: the other ranks' comms
  // report ncclRemoteError as their async error; their pending collectives
  // stay blocked (as real ones do) until the comm is aborted.
  static void kill_rank(const castmesh_te_unique_id_v1& id, int rank);
  // kill_rank for every communicator alive now.
  static void kill_rank_everywhere(int rank);
  // Communicators made and not yet destroyed or aborted (to check frees).
  static int64_t live_comms();
};

}  // namespace castmesh::fakes
