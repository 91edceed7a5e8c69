// The public metrics API (castmesh/metrics.h): collect across a mesh, user
// meters, and the observer connection.
#include "castmesh/metrics.h"

#include <cmath>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/metrics.pb.h"
#include "core/debug/metrics_service.h"
#include "core/metrics/meters.h"
#include "core/proc/proc_host.h"
#include "core/proc/typed_request.h"
#include "core/wire/status_code.h"

namespace castmesh::metrics {
namespace {

namespace v1 = wire::v1;

// Beyond what the procs get, time for a gather's reply to travel.
constexpr absl::Duration kTransitAllowance = absl::Seconds(5);

Instrument* instrument_of(void* handle) { return static_cast<Instrument*>(handle); }

absl::StatusOr<Instrument*> make_instrument(std::string_view meter, std::string_view name, InstrumentKind kind,
                                            std::string_view description, std::string_view unit) {
  if (name.empty()) return absl::InvalidArgumentError("an instrument needs a name");
  Instrument* made = instrument(meter, name, kind, description, unit);
  if (made == nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("meter '", std::string(meter), "' already has a ",
                                                 kind == InstrumentKind::kCounter ? "histogram" : "counter",
                                                 " named '", std::string(name), "'"));
  }
  return made;
}

}  // namespace

absl::StatusOr<std::vector<ProcMetrics>> collect(const ProcMesh& mesh, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("metrics: timeout must be positive");
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(mesh.runtime());
  if (host == nullptr) return absl::FailedPreconditionError("metrics: the mesh's runtime is not a proc");
  // In parallel: a proc that does not answer costs its timeout once, not once per proc.
  std::vector<std::future<v1::MetricsSnapshot>> pending;
  for (const ProcInfo& info : mesh.procs()) {
    pending.push_back(std::async(std::launch::async, [host, id = info.id, timeout] {
      return ask_snapshot(*host, id, timeout);
    }));
  }
  std::vector<ProcMetrics> out;
  const std::vector<ProcInfo> procs = mesh.procs();
  for (size_t i = 0; i < pending.size(); ++i) {
    ProcMetrics m = from_wire(pending[i].get());
    m.proc = procs[i];
    if (m.pid == 0) m.pid = procs[i].pid;
    out.push_back(std::move(m));
  }
  return out;
}

ProcMetrics this_process(const Runtime* runtime) { return from_wire(snapshot_this_process(runtime)); }

absl::Status Counter::add(double value, std::string_view attributes) const {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a counter adds a finite amount >= 0, not ", value));
  }
  instrument_of(instrument_)->add(value, attributes);
  return absl::OkStatus();
}

absl::Status Histogram::record(double value, std::string_view attributes) const {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("a histogram records finite values, not ", value));
  }
  instrument_of(instrument_)->add(value, attributes);
  return absl::OkStatus();
}

absl::StatusOr<Counter> counter(std::string_view meter, std::string_view name, std::string_view description,
                                std::string_view unit) {
  absl::StatusOr<Instrument*> made = make_instrument(meter, name, InstrumentKind::kCounter, description, unit);
  if (!made.ok()) return made.status();
  Counter c;
  c.instrument_ = *made;
  return c;
}

absl::StatusOr<Histogram> histogram(std::string_view meter, std::string_view name, std::string_view description,
                                    std::string_view unit) {
  absl::StatusOr<Instrument*> made = make_instrument(meter, name, InstrumentKind::kHistogram, description, unit);
  if (!made.ok()) return made.status();
  Histogram h;
  h.instrument_ = *made;
  return h;
}

absl::StatusOr<ObserverTarget> observer_target(const Runtime& runtime) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  if (host == nullptr) {
    return absl::FailedPreconditionError(
        "this runtime is not a proc yet (no proc mesh was started): nothing to observe");
  }
  return ObserverTarget{host->id(), host->secret()};
}

absl::StatusOr<std::unique_ptr<Observer>> Observer::connect(const std::string& address, const std::string& secret,
                                                            std::string name, absl::Duration timeout) {
  if (address.empty()) return absl::InvalidArgumentError("an observer needs the address of a controller or agent");
  if (secret.empty()) return absl::InvalidArgumentError("an observer needs the mesh secret (CASTMESH_SECRET)");
  std::unique_ptr<Observer> observer(new Observer());
  RuntimeOptions options;
  options.workers = 1;  // it runs no actors
  observer->runtime_ = std::make_unique<Runtime>(options);
  proc::ProcHostOptions host_options;
  host_options.secret = secret;
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> host = proc::ProcHost::attach(*observer->runtime_, host_options);
  if (!host.ok()) return host.status();
  observer->host_ = *host;
  observer->target_ = address;
  v1::ObserverAttach attach;
  attach.set_name(std::move(name));
  absl::StatusOr<v1::ObserverReply> reply = proc::request_reply<v1::ObserverReply>(**host, address, attach, timeout);
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("cannot observe ", address, ": ", reply.status().message(),
                                     " (is it running, and is the secret the mesh's?)"));
  }
  if (absl::Status st = wire::status_from_wire(*reply); !st.ok()) return st;
  observer->label_ = reply->label();
  return observer;
}

Observer::~Observer() {
  host_.reset();  // the proc goes before its runtime
  if (runtime_) runtime_->shutdown();
}

absl::StatusOr<std::vector<ProcMetrics>> Observer::metrics(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("metrics: timeout must be positive");
  auto* host = static_cast<proc::ProcHost*>(host_.get());
  v1::MetricsGather gather;
  gather.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  absl::StatusOr<v1::MetricsGathered> reply =
      proc::request_reply<v1::MetricsGathered>(*host, target_, gather, timeout + kTransitAllowance, "metrics");
  if (!reply.ok()) return reply.status();
  if (absl::Status st = wire::status_from_wire(*reply); !st.ok()) return st;
  std::vector<ProcMetrics> out;
  for (const v1::MetricsSnapshot& s : reply->procs()) out.push_back(from_wire(s));
  return out;
}

}  // namespace castmesh::metrics
