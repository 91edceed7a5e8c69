// The trace proc service and the controller side of gathering (trace_service.h).
#include "core/debug/trace_service.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/wire/v1/trace.pb.h"
#include "core/proc/proc_host.h"
#include "core/proc/typed_request.h"
#include "core/trace/recorder.h"
#include "core/wire/status_code.h"

namespace castmesh::trace {
namespace {

namespace v1 = wire::v1;

constexpr size_t kRecordBytes = 48;
// Round trips per clock estimate: the one with the smallest delay bounds the
// offset's error by half its delay.
constexpr int kClockProbes = 5;

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kTraceService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<TraceService>(host);
  });
  return true;
}();

uint64_t ring_records_or_setting(uint64_t ring_records) {
  return ring_records != 0 ? ring_records : config::global().trace_buffer_records;
}

}  // namespace

std::string self_label() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  std::string label;
  if (const char* rank = std::getenv("CASTMESH_RANK"); rank != nullptr && *rank != '\0') {
    label = absl::StrCat("rank ", rank, " ");
  }
  return absl::StrCat(label, "(", host, ":", getpid(), ")");
}

std::string pack_records(const std::vector<Record>& records) {
  std::string out(records.size() * kRecordBytes, '\0');
  char* p = out.data();
  for (const Record& r : records) {
    absl::little_endian::Store64(p, static_cast<uint64_t>(r.start_ns));
    absl::little_endian::Store64(p + 8, static_cast<uint64_t>(r.duration_ns));
    absl::little_endian::Store64(p + 16, r.flow);
    absl::little_endian::Store64(p + 24, r.value);
    absl::little_endian::Store32(p + 32, r.name);
    absl::little_endian::Store32(p + 36, r.detail);
    p[40] = static_cast<char>(r.category);
    p[41] = static_cast<char>(r.kind);
    p += kRecordBytes;
  }
  return out;
}

absl::StatusOr<std::vector<Record>> unpack_records(std::string_view bytes) {
  if (bytes.size() % kRecordBytes != 0) {
    return absl::DataLossError(
        absl::StrCat("trace records of ", bytes.size(), " bytes are not whole ", kRecordBytes, "-byte records"));
  }
  std::vector<Record> out(bytes.size() / kRecordBytes);
  const char* p = bytes.data();
  for (Record& r : out) {
    r.start_ns = static_cast<int64_t>(absl::little_endian::Load64(p));
    r.duration_ns = static_cast<int64_t>(absl::little_endian::Load64(p + 8));
    r.flow = absl::little_endian::Load64(p + 16);
    r.value = absl::little_endian::Load64(p + 24);
    r.name = absl::little_endian::Load32(p + 32);
    r.detail = absl::little_endian::Load32(p + 36);
    const auto category = static_cast<uint8_t>(p[40]);
    const auto kind = static_cast<uint8_t>(p[41]);
    if (category < 1 || category > static_cast<uint8_t>(Category::kUser) || kind < 1 ||
        kind > static_cast<uint8_t>(RecordKind::kAsyncEnd)) {
      return absl::DataLossError(absl::StrCat("a trace record has category ", category, " and kind ", kind,
                                              ", which this version does not know"));
    }
    r.category = static_cast<Category>(category);
    r.kind = static_cast<RecordKind>(kind);
    p += kRecordBytes;
  }
  return out;
}

TraceService::TraceService(proc::ProcHost& host) : host_(host) {
  // A proc started while its controller traces (the setting reached its
  // environment), or a process started with CASTMESH_TRACE: record from now.
  const config::Config& settings = config::global();
  if (!settings.trace.empty() && !on()) set_recording(true, settings.trace_buffer_records);

  host.on_control(v1::TraceControl().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    v1::TraceControl request;
                    v1::TraceReply reply;
                    if (!request.ParseFromString(payload)) {
                      wire::status_to_wire(absl::InvalidArgumentError("malformed TraceControl"), &reply);
                    } else {
                      set_recording(request.record(), ring_records_or_setting(request.ring_records()));
                    }
                    (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
                  });
  host.on_control(v1::TraceClockProbe().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string&) {
                    v1::TraceClock reply;
                    reply.set_now_ns(now_ns());
                    (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
                  });
  host.on_control(v1::TraceCollect().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string&) {
                    set_recording(false, 0);
                    v1::TraceRecords reply;
                    reply.set_label(self_label());
                    reply.set_pid(static_cast<int32_t>(getpid()));
                    // Records first: every text they name is interned by then.
                    std::vector<ThreadRecords> threads = take_records();
                    for (std::string& text : interned_texts()) reply.add_texts(std::move(text));
                    for (ThreadRecords& thread : threads) {
                      v1::TraceThread* out = reply.add_threads();
                      out->set_tid(thread.tid);
                      out->set_name(std::move(thread.name));
                      out->set_records(pack_records(thread.records));
                      out->set_dropped(thread.dropped);
                    }
                    (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
                  });
}

absl::Status control_peer(proc::ProcHost& host, const ProcId& peer, bool record, uint64_t ring_records,
                          absl::Duration timeout) {
  v1::TraceControl request;
  request.set_record(record);
  request.set_ring_records(ring_records);
  absl::StatusOr<v1::TraceReply> reply = proc::request_reply<v1::TraceReply>(host, peer, request, timeout);
  if (!reply.ok()) return reply.status();
  return wire::status_from_wire(*reply);
}

absl::StatusOr<ProcTrace> collect_peer(proc::ProcHost& host, const ProcId& peer, absl::Duration timeout) {
  ProcTrace out;
  int64_t best_delay = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < kClockProbes; ++i) {
    const int64_t sent = now_ns();
    absl::StatusOr<v1::TraceClock> clock =
        proc::request_reply<v1::TraceClock>(host, peer, v1::TraceClockProbe(), timeout);
    const int64_t back = now_ns();
    if (!clock.ok()) return clock.status();
    if (back - sent < best_delay) {
      best_delay = back - sent;
      out.clock_offset_ns = clock->now_ns() - (sent + (back - sent) / 2);
    }
  }
  absl::StatusOr<v1::TraceRecords> records =
      proc::request_reply<v1::TraceRecords>(host, peer, v1::TraceCollect(), timeout);
  if (!records.ok()) return records.status();
  if (absl::Status st = wire::status_from_wire(*records); !st.ok()) return st;
  out.label = records->label();
  out.texts.assign(records->texts().begin(), records->texts().end());
  for (const v1::TraceThread& thread : records->threads()) {
    absl::StatusOr<std::vector<Record>> unpacked = unpack_records(thread.records());
    if (!unpacked.ok()) {
      return absl::Status(unpacked.status().code(),
                          absl::StrCat(host.describe(peer), ": ", unpacked.status().message()));
    }
    ThreadRecords t;
    t.tid = thread.tid();
    t.name = thread.name();
    t.records = *std::move(unpacked);
    t.dropped = thread.dropped();
    out.threads.push_back(std::move(t));
  }
  return out;
}

}  // namespace castmesh::trace
