// Output of procs: what worker procs write to their stdout and stderr (file
// descriptors 1 and 2: C, C++ and Python alike) shown in the controller's,
// each line prefixed with the proc's point and host (docs/procs.md, "Output
// of procs"). Python: ProcMesh.logging_option(...).
#pragma once

#include <absl/status/status.h>
#include <absl/time/time.h>

#include <cstdint>

#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"

namespace castmesh {

// How a mesh's output is forwarded. Plain value.
struct OutputForwardingOptions {
  // True: every line goes to the controller; false: the procs write it where
  // their output went before (their agent's or launcher's terminal).
  bool stream_to_client = true;
  // Identical lines of several procs within this window are printed once,
  // with a count. Zero: every line as it comes.
  absl::Duration aggregate_window = absl::ZeroDuration();
  // Each proc keeps at most this many bytes of lines not yet sent; beyond
  // it the oldest are dropped (and counted in a notice) rather than block
  // the proc's writers. 0: 8 MiB.
  uint64_t backlog_bytes = 0;
};

// Starts forwarding the output of every proc of `procs` (a slice: those
// procs) as `options` say; a later call changes it. Lossless while a
// proc's backlog stays under its bound; the lines of one proc arrive in
// order. Blocks until every proc answered. Not on a castmesh I/O thread.
absl::Status forward_output(const ProcMesh& procs, const OutputForwardingOptions& options = {});

// Returns once every line received so far by this controller is written.
absl::Status flush_forwarded_output(Runtime& runtime);

}  // namespace castmesh
