// The public trace API (castmesh/trace.h): start and stop across the procs a
// runtime is connected to, and user spans.
#include "castmesh/trace.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/runtime.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/debug/chrome_trace.h"
#include "core/trace/recorder.h"
#include "core/debug/trace_service.h"

namespace castmesh::trace {
namespace {

// How long start() waits for each connected proc to say it records.
constexpr absl::Duration kControlTimeout = absl::Seconds(5);

// The runtime layer of the settings without `trace` (stop(): procs started
// later do not record).
void forget_trace_setting() {
  std::vector<std::pair<std::string, std::string>> values = config::runtime_config();
  std::erase_if(values, [](const auto& kv) { return kv.first == "trace"; });
  (void)config::set_runtime_config(values);
}

absl::Status start_in(Runtime* runtime, std::string path) {
  if (path.empty()) return absl::InvalidArgumentError("trace::start needs the path of the file to write");
  if (on()) return absl::FailedPreconditionError("a trace is already recording in this process; stop it first");
  {
    std::ofstream probe(path, std::ios::out | std::ios::app);
    if (!probe) return absl::InvalidArgumentError(absl::StrCat("cannot write the trace to ", path));
  }
  // The settings table carries the path: to procs started from now on, and to stop().
  if (absl::Status st = config::configure({{"trace", path}}); !st.ok()) return st;
  const uint64_t ring_records = config::global().trace_buffer_records;
  set_recording(true, ring_records);
  if (std::shared_ptr<proc::ProcHost> host = runtime != nullptr ? proc::ProcHost::of(*runtime) : nullptr) {
    for (const ProcId& peer : host->peers()) {
      if (absl::Status st = control_peer(*host, peer, true, ring_records, kControlTimeout); !st.ok()) {
        CASTMESH_LOG_WARN("trace: {} does not record: {}", host->describe(peer), std::string(st.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TraceSummary> stop_in(Runtime* runtime, absl::Duration timeout) {
  // start()'s path, or CASTMESH_TRACE's for a process that recorded from its start.
  const std::string path = config::global().trace;
  if (!on()) return absl::FailedPreconditionError("no trace is recording in this process (trace::start)");
  if (path.empty()) return absl::FailedPreconditionError("the trace has no file to go to (trace::start's path)");
  set_recording(false, 0);
  forget_trace_setting();

  TraceSummary summary;
  summary.path = path;
  std::vector<ProcTrace> procs;
  ProcTrace self;
  self.label = absl::StrCat("controller ", self_label());
  self.threads = take_records();
  self.texts = interned_texts();
  procs.push_back(std::move(self));
  if (std::shared_ptr<proc::ProcHost> host = runtime != nullptr ? proc::ProcHost::of(*runtime) : nullptr) {
    for (const ProcId& peer : host->peers()) {
      absl::StatusOr<ProcTrace> got = collect_peer(*host, peer, timeout);
      if (got.ok()) {
        procs.push_back(*std::move(got));
      } else {
        summary.unanswered.push_back(absl::StrCat(host->describe(peer), ": ", got.status().message()));
      }
    }
  }
  for (const ProcTrace& proc : procs) {
    for (const ThreadRecords& thread : proc.threads) summary.dropped += thread.dropped;
  }
  WriteCounts counts;
  if (absl::Status st = write_chrome_trace_file(path, procs, &counts); !st.ok()) return st;
  summary.procs = static_cast<int>(procs.size());
  summary.records = counts.events;
  return summary;
}

}  // namespace

absl::Status start(Runtime& runtime, std::string path) { return start_in(&runtime, std::move(path)); }
absl::Status start(std::string path) { return start_in(nullptr, std::move(path)); }
absl::StatusOr<TraceSummary> stop(Runtime& runtime, absl::Duration timeout) { return stop_in(&runtime, timeout); }
absl::StatusOr<TraceSummary> stop() { return stop_in(nullptr, absl::ZeroDuration()); }

bool recording() { return on(); }

int64_t clock_ns() { return now_ns(); }

uint32_t name_id(std::string_view name) { return intern(name); }

void record_span(std::string_view name, int64_t start_ns, int64_t end_ns) {
  if (!on()) return;
  slice(Category::kUser, intern_cached(name), start_ns, end_ns);
}

Span::Span(std::string_view name) {
  if (!on()) return;
  name_ = intern_cached(name);
  start_ns_ = now_ns();
}

Span::~Span() {
  if (start_ns_ < 0) return;
  slice(Category::kUser, name_, start_ns_, now_ns());
}

}  // namespace castmesh::trace
