// The metrics proc service ("metrics"; docs/observability.md, "Metrics"):
// answers a MetricsRequest with this proc's snapshot (its actors' counters,
// the process's transport, path and communicator counters, its user
// meters), and a MetricsGather (an observer's, at a controller or agent)
// with its own snapshot and every connected proc's. Both are allowed to
// read-only observers. Also the conversion of a snapshot to the public form.
//
// Threading: a MetricsRequest is answered on the host's I/O thread (a
// snapshot takes short locks only); a gather waits for peers, so it runs on
// the service's own thread, started on the first one; detach() joins it.
#pragma once

#include <cstdint>
#include <deque>
#include <thread>

#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/metrics.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/metrics.pb.h"
#include "core/proc/proc_service.h"

namespace castmesh::proc {
class ProcHost;
}  // namespace castmesh::proc

namespace castmesh::metrics {

inline constexpr char kMetricsService[] = "metrics";

// This process's snapshot; the actors of `runtime` when it is not null.
wire::v1::MetricsSnapshot snapshot_this_process(const Runtime* runtime);
// The wire form in the public one (status from its error fields).
ProcMetrics from_wire(const wire::v1::MetricsSnapshot& snapshot);
// Asks `peer` for its snapshot; a failure is in the snapshot's error fields.
wire::v1::MetricsSnapshot ask_snapshot(proc::ProcHost& host, const ProcId& peer, absl::Duration timeout);

class MetricsService : public proc::ProcService {
 public:
  explicit MetricsService(proc::ProcHost& host);
  ~MetricsService() override;

  void detach() override;

 private:
  struct Gather {
    ProcId peer;
    uint64_t correlation = 0;
    absl::Duration timeout;
  };
  void run();

  proc::ProcHost& host_;
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<Gather> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::metrics
