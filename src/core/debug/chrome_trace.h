// Writes gathered trace records as one Chrome trace-event JSON file
// ({"traceEvents": [...], "displayTimeUnit": "ns"}), the format Perfetto's UI
// and chrome://tracing open: a process per proc (pid = its index in the
// file, named by its label), a thread track per thread, complete events
// ("X") for slices, flow events ("s" / "f", bound to the enclosing slice)
// for arrows between procs, async slices ("b" / "e": operations that end on
// another thread), instants ("i"). Plain functions; any thread.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/trace/recorder.h"

namespace castmesh::trace {

// One proc's records as the controller gathered them. Plain value.
struct ProcTrace {
  std::string label;               // the process track's name
  int64_t clock_offset_ns = 0;     // its clock minus the controller's (subtracted from its times)
  std::vector<std::string> texts;  // its interned texts, by id
  std::vector<ThreadRecords> threads;
};

// What write_chrome_trace wrote. Plain value.
struct WriteCounts {
  uint64_t events = 0;           // trace events written (metadata excluded)
  uint64_t unmatched_flows = 0;  // flow or async ends whose other end was not recorded (left out)
};

// Writes `procs` to `out`. Times become microseconds from the earliest
// record, each proc's shifted by its offset; each thread's events are sorted
// by start (a slice before the slices it encloses). A flow id seen only once
// (its other end was dropped or its proc did not answer) is left out.
WriteCounts write_chrome_trace(std::ostream& out, const std::vector<ProcTrace>& procs);

// The same into the file at `path` (replaced). An error names the path.
absl::Status write_chrome_trace_file(const std::string& path, const std::vector<ProcTrace>& procs,
                                     WriteCounts* counts);

// `text` as a JSON string literal (quotes included).
std::string json_string(std::string_view text);

}  // namespace castmesh::trace
