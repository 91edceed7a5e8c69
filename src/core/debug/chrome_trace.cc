// The Chrome trace-event JSON writer (chrome_trace.h).
#include "core/debug/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace castmesh::trace {
namespace {

std::string_view text_of(const ProcTrace& proc, uint32_t id) {
  return id < proc.texts.size() ? std::string_view(proc.texts[id]) : std::string_view("?");
}

// A record's value and detail as the event's "args" ("" when it has neither).
std::string args(const ProcTrace& proc, const Record& r) {
  if (r.value == 0 && r.detail == 0) return "";
  std::string out = ",\"args\":{";
  if (r.value != 0) absl::StrAppend(&out, "\"value\":", r.value);
  if (r.detail != 0) absl::StrAppend(&out, r.value != 0 ? "," : "", "\"detail\":", json_string(text_of(proc, r.detail)));
  return out + "}";
}

// Microseconds with nanosecond digits, as Chrome's format wants them.
std::string micros(int64_t ns) { return absl::StrFormat("%.3f", static_cast<double>(ns) / 1000.0); }

}  // namespace

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;  // UTF-8 passes through; JSON allows it
        }
    }
  }
  return out + "\"";
}

WriteCounts write_chrome_trace(std::ostream& out, const std::vector<ProcTrace>& procs) {
  WriteCounts counts;
  // Flow ids seen on each side: an arrow is drawn only when both ends are here.
  absl::flat_hash_map<uint64_t, int> ends;
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const ProcTrace& proc : procs) {
    for (const ThreadRecords& thread : proc.threads) {
      for (const Record& r : thread.records) {
        origin = std::min(origin, r.start_ns - proc.clock_offset_ns);
        if (r.kind == RecordKind::kFlowOut || r.kind == RecordKind::kAsyncBegin) ends[r.flow] |= 1;
        if (r.kind == RecordKind::kFlowIn || r.kind == RecordKind::kAsyncEnd) ends[r.flow] |= 2;
      }
    }
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;

  out << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  auto begin_event = [&] {
    out << (first ? "\n" : ",\n");
    first = false;
  };
  for (size_t p = 0; p < procs.size(); ++p) {
    const ProcTrace& proc = procs[p];
    const int pid = static_cast<int>(p) + 1;
    begin_event();
    out << "{\"ph\":\"M\",\"pid\":" << pid << ",\"name\":\"process_name\",\"args\":{\"name\":"
        << json_string(proc.label) << "}}";
    begin_event();
    out << "{\"ph\":\"M\",\"pid\":" << pid << ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" << pid
        << "}}";
    for (const ThreadRecords& thread : proc.threads) {
      if (thread.records.empty()) continue;
      begin_event();
      out << "{\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << thread.tid
          << ",\"name\":\"thread_name\",\"args\":{\"name\":" << json_string(thread.name) << "}}";
      std::vector<const Record*> sorted;
      sorted.reserve(thread.records.size());
      for (const Record& r : thread.records) sorted.push_back(&r);
      // By start; at one start the longer slice first, so it encloses the shorter.
      std::stable_sort(sorted.begin(), sorted.end(), [](const Record* a, const Record* b) {
        if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
        return a->duration_ns > b->duration_ns;
      });
      for (const Record* r : sorted) {
        const int64_t ts = r->start_ns - proc.clock_offset_ns - origin;
        const std::string where =
            absl::StrCat("\"pid\":", pid, ",\"tid\":", thread.tid, ",\"ts\":", micros(ts), ",\"cat\":",
                         json_string(category_name(r->category)));
        switch (r->kind) {
          case RecordKind::kSlice: {
            begin_event();
            out << "{\"ph\":\"X\"," << where << ",\"dur\":" << micros(std::max<int64_t>(r->duration_ns, 0))
                << ",\"name\":" << json_string(text_of(proc, r->name)) << args(proc, *r) << "}";
            ++counts.events;
            break;
          }
          case RecordKind::kFlowOut:
          case RecordKind::kFlowIn: {
            if (ends[r->flow] != 3) {
              ++counts.unmatched_flows;
              break;
            }
            begin_event();
            const bool out_end = r->kind == RecordKind::kFlowOut;
            out << "{\"ph\":\"" << (out_end ? "s" : "f") << "\"," << where << ",\"name\":\"message\",\"id\":\""
                << absl::StrFormat("0x%x", r->flow) << "\"" << (out_end ? "" : ",\"bp\":\"e\"") << "}";
            ++counts.events;
            break;
          }
          case RecordKind::kAsyncBegin:
          case RecordKind::kAsyncEnd: {
            if (ends[r->flow] != 3) {
              ++counts.unmatched_flows;
              break;
            }
            begin_event();
            out << "{\"ph\":\"" << (r->kind == RecordKind::kAsyncBegin ? "b" : "e") << "\"," << where
                << ",\"name\":" << json_string(text_of(proc, r->name)) << ",\"id\":\""
                << absl::StrFormat("0x%x", r->flow) << "\"" << args(proc, *r) << "}";
            ++counts.events;
            break;
          }
          case RecordKind::kInstant: {
            begin_event();
            out << "{\"ph\":\"i\",\"s\":\"t\"," << where << ",\"name\":" << json_string(text_of(proc, r->name))
                << args(proc, *r) << "}";
            ++counts.events;
            break;
          }
        }
      }
    }
  }
  out << "\n]}\n";
  return counts;
}

absl::Status write_chrome_trace_file(const std::string& path, const std::vector<ProcTrace>& procs,
                                     WriteCounts* counts) {
  std::ofstream file(path, std::ios::out | std::ios::trunc);
  if (!file) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write the trace to ", path, ": ", std::strerror(errno)));
  }
  WriteCounts written = write_chrome_trace(file, procs);
  file.flush();
  if (!file) return absl::InternalError(absl::StrCat("writing the trace to ", path, " failed: ", std::strerror(errno)));
  if (counts != nullptr) *counts = written;
  return absl::OkStatus();
}

}  // namespace castmesh::trace
