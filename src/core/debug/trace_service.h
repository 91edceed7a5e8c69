// The trace proc service ("trace"): in every proc, turns recording on and
// off when the controller says so (or at attach, when the settings table's
// `trace` is set) and hands its records over; in the controller, the calls
// that do that to a peer and estimate the peer's clock offset.
// docs/observability.md.
//
// Threading: handlers run on the endpoint's I/O thread and do not block;
// control_peer() and collect_peer() block their caller and must not run on it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/address.h"
#include "core/proc/proc_service.h"
#include "core/debug/chrome_trace.h"

namespace castmesh::proc {
class ProcHost;
}  // namespace castmesh::proc

namespace castmesh::trace {

inline constexpr char kTraceService[] = "trace";

// What this process says of itself in a trace: "rank R " when launched with
// one, then "host:pid" (the controller's own label says "controller").
std::string self_label();

// Installed on every ProcHost: answers TraceControl, TraceClockProbe and
// TraceCollect. Its handlers run on the host's I/O thread while the host
// lives.
class TraceService : public proc::ProcService {
 public:
  explicit TraceService(proc::ProcHost& host);
  void detach() override {}

 private:
  proc::ProcHost& host_;
};

// Has `peer` start (`record`) or stop recording. Blocks up to `timeout`; the
// caller holds `host` and is not on its I/O thread.
absl::Status control_peer(proc::ProcHost& host, const ProcId& peer, bool record, uint64_t ring_records,
                          absl::Duration timeout);
// Stops `peer`'s recording and takes its records, with its clock offset
// estimated from a few round trips (the one with the smallest delay).
// Blocks up to about 2 x `timeout`; as control_peer.
absl::StatusOr<ProcTrace> collect_peer(proc::ProcHost& host, const ProcId& peer, absl::Duration timeout);

// The 48-byte wire form of `threads`' records (TraceThread.records) and back.
std::string pack_records(const std::vector<Record>& records);
absl::StatusOr<std::vector<Record>> unpack_records(std::string_view bytes);

}  // namespace castmesh::trace
