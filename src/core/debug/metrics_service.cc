// The metrics proc service and snapshots (metrics_service.h).
#include "core/debug/metrics_service.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/runtime_transport.h"
#include "core/actor/runtime_core.h"
#include "core/debug/trace_service.h"
#include "core/log/log.h"
#include "core/metrics/counters.h"
#include "core/metrics/meters.h"
#include "core/platform/process.h"
#include "core/proc/proc_host.h"
#include "core/proc/typed_request.h"
#include "core/wire/status_code.h"

namespace castmesh::metrics {
namespace {

namespace v1 = wire::v1;

// A gather's bound per proc, whatever the observer asks for.
constexpr absl::Duration kMaxGatherTimeout = absl::Minutes(1);

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kMetricsService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<MetricsService>(host);
  });
  return true;
}();

void fill_flow(v1::FlowMetrics* out, std::string_view name, const FlowCounters& c) {
  out->set_name(std::string(name));
  out->set_messages_in(c.messages_in.get());
  out->set_bytes_in(c.bytes_in.get());
  out->set_messages_out(c.messages_out.get());
  out->set_bytes_out(c.bytes_out.get());
}

FlowMetrics flow_from_wire(const v1::FlowMetrics& f) {
  return FlowMetrics{f.name(), f.messages_in(), f.bytes_in(), f.messages_out(), f.bytes_out()};
}

}  // namespace

v1::MetricsSnapshot snapshot_this_process(const Runtime* runtime) {
  v1::MetricsSnapshot out;
  out.set_label(trace::self_label());
  out.set_pid(static_cast<int32_t>(::getpid()));
  for (int64_t bound : kHandlerBucketBoundsNs) out.add_handler_bucket_bounds_ns(bound);
  for (double bound : kHistogramBounds) out.add_histogram_bounds(bound);
  if (runtime != nullptr) {
    out.set_proc_id(runtime->proc_id());
    if (detail::RuntimeCore* core = detail::RuntimeTransportSeam::core(*runtime)) {
      std::vector<std::shared_ptr<detail::ActorCell>> cells = core->local_cells();
      std::sort(cells.begin(), cells.end(), [](const auto& a, const auto& b) {
        return std::tie(a->address().name, a->address().index) < std::tie(b->address().name, b->address().index);
      });
      for (const auto& cell : cells) {
        const ActorCounters& c = cell->counters();
        v1::ActorMetrics* a = out.add_actors();
        a->set_name(cell->address().name);
        a->set_index(cell->address().index);
        a->set_actor_class(std::string(cell->class_name()));
        a->set_messages_in(c.messages_in());
        a->set_messages_out(c.messages_out());
        a->set_mailbox_depth(c.mailbox_depth());
        a->set_mailbox_max(c.mailbox_max());
        a->set_handler_count(c.handler_count());
        a->set_handler_ns(c.handler_ns());
        for (size_t b = 0; b < kHandlerBuckets; ++b) a->add_handler_buckets(c.handler_bucket(b));
      }
    }
  }
  for (size_t t = 0; t < kTransports; ++t) {
    const auto kind = static_cast<Transport>(t);
    const FlowCounters& c = transport(kind);
    if (kind == Transport::kOther && c.messages_in.get() == 0 && c.messages_out.get() == 0) continue;
    fill_flow(out.add_transports(), transport_name(kind), c);
  }
  for (const auto& [name, counters] : paths()) fill_flow(out.add_paths(), name, *counters);
  CommunicatorCounters::for_each([&out](const CommunicatorCounters& c) {
    v1::CommunicatorMetrics* m = out.add_communicators();
    m->set_description(c.description());
    m->set_rank(c.rank());
    m->set_size(c.size());
    for (size_t slot = 0; slot < kMaxCollectiveKinds; ++slot) {
      const CommunicatorCounters::Kind& k = c.kind(slot);
      if (k.calls.get() == 0) continue;
      v1::CollectiveMetrics* col = m->add_collectives();
      col->set_kind(collective_kind_name(slot));
      col->set_calls(k.calls.get());
      col->set_bytes(k.bytes.get());
    }
  });
  for (const InstrumentValues& i : instrument_values()) {
    v1::MeterInstrument* m = out.add_meters();
    m->set_meter(i.meter);
    m->set_name(i.name);
    m->set_kind(i.kind == InstrumentKind::kCounter ? "counter" : "histogram");
    m->set_description(i.description);
    m->set_unit(i.unit);
    for (const SeriesValues& s : i.series) {
      v1::MeterSeries* series = m->add_series();
      series->set_attributes(s.attributes);
      series->set_count(s.count);
      series->set_sum(s.sum);
      if (i.kind == InstrumentKind::kHistogram) {
        series->set_min(s.min);
        series->set_max(s.max);
        for (uint64_t b : s.buckets) series->add_buckets(b);
      }
    }
  }
  return out;
}

ProcMetrics from_wire(const v1::MetricsSnapshot& s) {
  ProcMetrics out;
  out.status = wire::status_from_wire(s);
  out.proc_id = s.proc_id();
  out.label = s.label();
  out.pid = s.pid();
  for (const v1::ActorMetrics& a : s.actors()) {
    out.actors.push_back(ActorMetrics{a.name(), a.index(), a.actor_class(), a.messages_in(), a.messages_out(),
                                      a.mailbox_depth(), a.mailbox_max(), a.handler_count(), a.handler_ns(),
                                      {a.handler_buckets().begin(), a.handler_buckets().end()}});
  }
  for (const v1::FlowMetrics& f : s.transports()) out.transports.push_back(flow_from_wire(f));
  for (const v1::FlowMetrics& f : s.paths()) out.paths.push_back(flow_from_wire(f));
  for (const v1::CommunicatorMetrics& c : s.communicators()) {
    CommunicatorMetrics m{c.description(), c.rank(), c.size(), {}};
    for (const v1::CollectiveMetrics& k : c.collectives()) m.collectives.push_back({k.kind(), k.calls(), k.bytes()});
    out.communicators.push_back(std::move(m));
  }
  for (const v1::MeterInstrument& i : s.meters()) {
    MeterInstrument m{i.meter(), i.name(), i.kind(), i.description(), i.unit(), {}};
    for (const v1::MeterSeries& series : i.series()) {
      m.series.push_back(MeterSeries{series.attributes(), series.count(), series.sum(), series.min(), series.max(),
                                     {series.buckets().begin(), series.buckets().end()}});
    }
    out.meters.push_back(std::move(m));
  }
  out.handler_bucket_bounds_ns.assign(s.handler_bucket_bounds_ns().begin(), s.handler_bucket_bounds_ns().end());
  out.histogram_bounds.assign(s.histogram_bounds().begin(), s.histogram_bounds().end());
  return out;
}

v1::MetricsSnapshot ask_snapshot(proc::ProcHost& host, const ProcId& peer, absl::Duration timeout) {
  absl::StatusOr<v1::MetricsSnapshot> reply =
      proc::request_reply<v1::MetricsSnapshot>(host, peer, v1::MetricsRequest(), timeout, "metrics");
  if (reply.ok()) return *std::move(reply);
  v1::MetricsSnapshot failed;
  failed.set_proc_id(peer);
  wire::status_to_wire(reply.status(), &failed);
  return failed;
}

MetricsService::MetricsService(proc::ProcHost& host) : host_(host) {
  host.allow_observers(v1::MetricsRequest().GetTypeName());
  host.allow_observers(v1::MetricsGather().GetTypeName());
  host.on_control(v1::MetricsRequest().GetTypeName(), [this](const ProcId& peer, uint64_t correlation,
                                                              const std::string&) {
    (void)host_.send_control(peer, snapshot_this_process(&host_.runtime()), correlation, /*is_reply=*/true);
  });
  host.on_control(v1::MetricsGather().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    v1::MetricsGather request;
                    if (!request.ParseFromString(payload)) {
                      v1::MetricsGathered reply;
                      wire::status_to_wire(absl::InvalidArgumentError("malformed MetricsGather"), &reply);
                      (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
                      return;
                    }
                    const absl::Duration timeout = std::clamp(absl::Milliseconds(request.timeout_ms()),
                                                              absl::Milliseconds(1), kMaxGatherTimeout);
                    detail::MutexLock lock(mu_);
                    if (stopping_) return;
                    queue_.push_back(Gather{peer, correlation, timeout});
                    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
                    cv_.notify_one();
                  });
}

MetricsService::~MetricsService() { detach(); }

void MetricsService::run() {
  platform::set_current_thread_name("cm-metrics");
  for (;;) {
    Gather g;
    {
      detail::MutexLock lock(mu_);
      cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      g = std::move(queue_.front());
      queue_.pop_front();
    }
    v1::MetricsGathered reply;
    *reply.add_procs() = snapshot_this_process(&host_.runtime());
    // Every connected proc but observers (the asker among them), in parallel.
    std::vector<std::future<v1::MetricsSnapshot>> pending;
    for (const ProcId& peer : host_.peers()) {
      if (peer == g.peer || host_.is_observer(peer)) continue;
      pending.push_back(std::async(std::launch::async, [this, peer, timeout = g.timeout] {
        return ask_snapshot(host_, peer, timeout);
      }));
    }
    for (auto& p : pending) *reply.add_procs() = p.get();
    // detach() joins this thread before the host goes, so host_ is valid here.
    (void)host_.send_control(g.peer, reply, g.correlation, /*is_reply=*/true);
  }
}

void MetricsService::detach() {
  std::thread thread;
  {
    detail::MutexLock lock(mu_);
    stopping_ = true;
    thread = std::move(thread_);
    cv_.notify_one();
  }
  if (thread.joinable()) thread.join();  // a gather in progress ends within its bounds
}

}  // namespace castmesh::metrics
