// Traces of message flow for Perfetto (docs/observability.md): while a trace
// is on, every proc records handler runs, cross-proc sends and receives
// (linked by flow ids), collectives, RDMA operations and user spans into
// bounded per-thread rings; stop() gathers every reachable proc's records to
// this process and writes one Chrome trace-event JSON file
// ({"traceEvents": [...]}) that ui.perfetto.dev and chrome://tracing open:
// one process track per proc, one thread track per thread, flow arrows
// between procs, clocks aligned to this process's.
//
// Cost: off, each recording site is one relaxed load and a predictable
// branch; on, a record is a clock read and six relaxed stores into the
// calling thread's ring (no lock, no allocation after a thread's first
// record). A ring keeps the newest records; older ones are dropped and
// counted (setting trace_buffer_records).
//
// Threading: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace castmesh {
class Runtime;
}  // namespace castmesh

namespace castmesh::trace {

// What stop() wrote. Plain value.
struct TraceSummary {
  std::string path;                     // the file written
  int procs = 0;                        // processes in the file (this one included)
  uint64_t records = 0;                 // records written
  uint64_t dropped = 0;                 // records the rings dropped (oldest first)
  std::vector<std::string> unanswered;  // procs that did not answer in time, with why
};

// Starts recording in this process, in every proc `runtime` is connected to
// now, and in every proc it starts from now on (through the settings table's
// `trace`, which reaches new procs' environment). `path` is where stop()
// writes. FailedPrecondition while a trace is already on here.
absl::Status start(Runtime& runtime, std::string path);
// The same before a runtime exists: this process and the procs it starts.
absl::Status start(std::string path);

// Stops recording here and in the connected procs, gathers their records
// (each proc's clock aligned by the round trip with the smallest delay of a
// few probes) and writes the file. A proc that does not answer within
// `timeout` is left out and named in the summary. FailedPrecondition when
// no trace is on.
absl::StatusOr<TraceSummary> stop(Runtime& runtime, absl::Duration timeout = absl::Seconds(10));
// The same without a runtime: this process's records only.
absl::StatusOr<TraceSummary> stop();

// Whether this process records now.
bool recording();

// The clock of trace records: CLOCK_MONOTONIC in nanoseconds.
int64_t clock_ns();
// Records a user span [start_ns, end_ns) (clock_ns times) on the calling
// thread, for spans that are not a C++ scope (a Python `with` block). Does
// nothing while no trace is on.
void record_span(std::string_view name, int64_t start_ns, int64_t end_ns);

// The id under which `name` appears in this process's trace (interned
// once: the same text always gets the same id; takes a lock the first time).
uint32_t name_id(std::string_view name);
// Names the handler slice of the handler the calling thread runs now by
// `name_id` instead of its message type: for a handler that serves many
// endpoints (the Python actor server names "Class.endpoint"). Call it from
// inside the handler while recording(); the slice's end takes it.
void name_current_handler(uint32_t name_id);

// A user span: records [construction, destruction) on the calling thread as
// a slice named `name` (nested inside the handler that runs it). Does
// nothing while no trace is on. Not movable; one thread.
class Span {
 public:
  explicit Span(std::string_view name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  uint32_t name_ = 0;
  int64_t start_ns_ = -1;  // -1: not recording
};

}  // namespace castmesh::trace
