// Built-in metrics and user meters of running procs (docs/observability.md,
// "Metrics").
//
//  * castmesh::metrics::collect(proc_mesh): for every proc of the mesh, a
//    snapshot of its always-on counters: per actor (messages in and out,
//    mailbox depth, handler time), per transport and per data-plane path
//    (messages and bytes), per communicator (calls and bytes per collective
//    kind), and the values of its user meters.
//  * this_process(): the same for the calling process.
//  * counter() / histogram(): meters for user code, named like
//    OpenTelemetry's (meter name, instrument name); their values appear in
//    the snapshots under `meters`.
//  * Observer: a read-only connection to a controller or agent (the mesh
//    secret authenticates it; it reads metrics and stack dumps and can
//    neither spawn nor send to actors; docs/security.md).
//
// Threading: every function may be called from any thread; collect() and
// Observer's calls block their caller for at most about their timeout.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"

namespace castmesh::metrics {

// One actor's counters since it started. Plain value.
struct ActorMetrics {
  std::string name;           // the actor's name: its mesh's name for a mesh's actors
  uint64_t index = 0;         // its index (rank in its mesh)
  std::string actor_class;    // its C++ class (castmesh::python::PyCall's actor for Python)
  uint64_t messages_in = 0;   // user messages delivered to its mailbox
  uint64_t messages_out = 0;  // messages it sent to actors while its handlers ran
  uint64_t mailbox_depth = 0; // messages waiting now
  uint64_t mailbox_max = 0;   // the most that ever waited
  uint64_t handler_count = 0; // handler runs
  uint64_t handler_ns = 0;    // their total time
  // Handler runs per bucket: ProcMetrics::handler_bucket_bounds_ns are the
  // upper bounds; the last bucket counts the longer runs.
  std::vector<uint64_t> handler_buckets;
};

// Messages and bytes in and out on one transport ("unix", "tcp") or one
// data-plane path ("in_process", "shm_ring", "single_copy", "socket", ...).
// Plain value.
struct FlowMetrics {
  std::string name;
  uint64_t messages_in = 0, bytes_in = 0, messages_out = 0, bytes_out = 0;
};

// One collective kind of one communicator rank. Plain value.
struct CollectiveMetrics {
  std::string kind;  // "allreduce", "broadcast", ...
  uint64_t calls = 0;
  uint64_t bytes = 0;  // the user data of those calls on this rank (count x element size)
};

// One communicator rank of this proc. Plain value.
struct CommunicatorMetrics {
  std::string description;
  int rank = 0, size = 0;
  std::vector<CollectiveMetrics> collectives;  // kinds called at least once
};

// One attribute set of a user instrument. Plain value.
struct MeterSeries {
  std::string attributes;  // "k=v,k=v" sorted by key; empty: none
  uint64_t count = 0;      // add()/record() calls
  double sum = 0;          // a counter's value; a histogram's sum
  double min = 0, max = 0;         // histograms
  std::vector<uint64_t> buckets;   // histograms: ProcMetrics::histogram_bounds, then "above"
};

// One user instrument. Plain value.
struct MeterInstrument {
  std::string meter, name, kind;  // kind: "counter" | "histogram"
  std::string description, unit;
  std::vector<MeterSeries> series;
};

// One proc's snapshot. Plain value.
struct ProcMetrics {
  ProcInfo proc;        // as the mesh knows it (empty for this_process and observers)
  std::string proc_id;  // as the proc says
  std::string label;    // "rank R (host:pid)"
  int64_t pid = 0;
  absl::Status status;  // not ok: no snapshot (the rest is empty)
  std::vector<ActorMetrics> actors;
  std::vector<FlowMetrics> transports;
  std::vector<FlowMetrics> paths;
  std::vector<CommunicatorMetrics> communicators;
  std::vector<MeterInstrument> meters;
  std::vector<int64_t> handler_bucket_bounds_ns;
  std::vector<double> histogram_bounds;
};

// Every proc's snapshot, in parallel; a proc that does not answer within
// `timeout` gets a non-ok status. Fails only when the mesh's runtime is not
// a proc. Call it in the controller that started the procs.
absl::StatusOr<std::vector<ProcMetrics>> collect(const ProcMesh& mesh, absl::Duration timeout = absl::Seconds(5));

// This process's snapshot (its actors when `runtime` is given).
ProcMetrics this_process(const Runtime* runtime = nullptr);

// A user counter: add() a non-negative amount. Copyable handle; any thread.
class Counter {
 public:
  // InvalidArgument for a negative or non-finite value.
  absl::Status add(double value, std::string_view attributes = {}) const;

 private:
  friend absl::StatusOr<Counter> counter(std::string_view, std::string_view, std::string_view, std::string_view);
  void* instrument_ = nullptr;
};

// A user histogram: record() values. Copyable handle; any thread.
class Histogram {
 public:
  // InvalidArgument for a non-finite value.
  absl::Status record(double value, std::string_view attributes = {}) const;

 private:
  friend absl::StatusOr<Histogram> histogram(std::string_view, std::string_view, std::string_view,
                                             std::string_view);
  void* instrument_ = nullptr;
};

// The counter `name` of meter `meter` (made on first use, the same one
// after). `attributes` of add(): "k=v,k=v" (the Python side sorts them).
// AlreadyExists when the name is a histogram of that meter; InvalidArgument
// for an empty name.
absl::StatusOr<Counter> counter(std::string_view meter, std::string_view name, std::string_view description = {},
                                std::string_view unit = {});
// The histogram `name` of meter `meter`; as counter().
absl::StatusOr<Histogram> histogram(std::string_view meter, std::string_view name,
                                    std::string_view description = {}, std::string_view unit = {});

// Where an observer connects, and the secret it proves: the address of
// `runtime`'s proc and its mesh secret. FailedPrecondition when the runtime
// is not a proc. The secret is the mesh's: whoever holds it can also
// control the mesh; hand it only to whom you would hand the controller.
struct ObserverTarget {
  std::string address;
  std::string secret;
};
absl::StatusOr<ObserverTarget> observer_target(const Runtime& runtime);

// A read-only observer connection to a controller or host agent: its own
// small runtime and proc (on a fresh Unix address), which attached to the
// target as an observer. Thread-safe.
class Observer {
 public:
  // Connects to `address` with `secret` and attaches as an observer
  // (`name` appears in the target's log). Fails when the connection or
  // the handshake (a wrong secret) fails within `timeout`.
  static absl::StatusOr<std::unique_ptr<Observer>> connect(const std::string& address, const std::string& secret,
                                                           std::string name = "observer",
                                                           absl::Duration timeout = absl::Seconds(10));
  ~Observer();
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // The target's snapshot and those of every proc it is connected to
  // (the target first). Each proc gets `timeout` to answer.
  absl::StatusOr<std::vector<ProcMetrics>> metrics(absl::Duration timeout = absl::Seconds(5));
  // What the target says of itself (its proc address).
  const std::string& target_label() const { return label_; }
  const std::string& target() const { return target_; }
  // The observer's own runtime: what it sends from here the target refuses
  // (tests). Valid while the observer lives.
  Runtime& runtime() { return *runtime_; }

 private:
  Observer() = default;
  std::unique_ptr<Runtime> runtime_;
  std::shared_ptr<void> host_;  // the runtime's proc (an internal ProcHost)
  std::string target_;
  std::string label_;
};

}  // namespace castmesh::metrics
