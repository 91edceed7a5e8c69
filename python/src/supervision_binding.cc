// Supervision's C++ half for castmesh.supervision: monitors on Python actor
// hosts, a queue of the failures they report to the one Python thread that
// handles them, and futures of "every one of these actors has stopped".
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "actor_server.h"
#include "bindings.h"
#include "call_slot.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/runtime.h"
#include "castmesh/supervision.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

// One watched actor stopped with an error (see watch_failures).
struct FailureReport {
  int64_t token = 0;     // the watch's token (castmesh.supervision's mesh record)
  int64_t position = 0;  // the member's position in the list that was watched
  std::string actor;     // its address
  std::string reason;    // the status, "ABORTED: ..."
};

// Failures of watched actors, from the runtime threads that report them to
// the one Python thread that handles them (castmesh.supervision). Never
// destroyed: runtime threads may push while the interpreter exits.
class FailureQueue {
 public:
  // Any thread; never blocks on Python. Dropped once the queue is closed.
  void push(FailureReport report) {
    {
      detail::MutexLock lock(mu_);
      if (closed_) return;
      reports_.push_back(std::move(report));
    }
    cv_.notify_one();
  }

  // The next report as (token, position, actor, reason), or None after
  // `timeout` seconds or at once when the queue is closed. Waits with the
  // GIL released.
  py::object next(double timeout) {
    std::optional<FailureReport> report;
    {
      py::gil_scoped_release release;
      detail::MutexLock lock(mu_);
      cv_.wait_for(lock, absl::Seconds(timeout), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || !reports_.empty();
      });
      if (!closed_ && !reports_.empty()) {
        report = std::move(reports_.front());
        reports_.pop_front();
      }
    }
    if (!report) return py::none();
    return py::make_tuple(report->token, report->position, report->actor, report->reason);
  }

  // The process is exiting: wakes the waiting thread so that it can be
  // joined while Python still runs threads (a thread that takes the GIL back
  // after finalization has begun is ended by pthread_exit, whose unwinding
  // through pybind11's noexcept gil_scoped_release ends in std::terminate).
  void close() {
    {
      detail::MutexLock lock(mu_);
      closed_ = true;
      reports_.clear();
    }
    cv_.notify_all();
  }

 private:
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<FailureReport> reports_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

FailureQueue& failure_queue() {
  static auto* queue = new FailureQueue();
  return *queue;
}

// Monitors every ref; each that stops with an error (not a normal stop) is
// reported to failure_queue() under `token` and its position in `refs`.
void watch_failures(const std::vector<PyActorRef>& refs, int64_t token) {
  Runtime& runtime = current_runtime();
  py::gil_scoped_release release;
  for (size_t i = 0; i < refs.size(); ++i) {
    runtime.monitor(refs[i].ref, [token, position = static_cast<int64_t>(i)](const DownEvent& event) {
      if (event.reason.ok()) return;
      failure_queue().push(FailureReport{token, position, event.actor.to_string(),
                                         absl::StatusCodeToString(event.reason.code()) + ": " +
                                             std::string(event.reason.message())});
    });
  }
}

// A future completed (with empty bytes) once every ref has stopped, for any
// reason; monitors are set before the caller stops them.
std::shared_ptr<CallFuture> watch_stopped(const std::vector<PyActorRef>& refs) {
  auto slot = std::make_shared<CallFuture>();
  if (refs.empty()) {
    slot->complete(std::string());
    return slot;
  }
  Runtime& runtime = current_runtime();
  auto left = std::make_shared<std::atomic<size_t>>(refs.size());
  py::gil_scoped_release release;
  for (const PyActorRef& r : refs) {
    runtime.monitor(r.ref, [slot, left](const DownEvent&) {
      if (left->fetch_sub(1) == 1) slot->complete(std::string());
    });
  }
  return slot;
}

}  // namespace

void bind_supervision(py::module_& module) {
  module.def("watch_failures", &watch_failures, py::arg("refs"), py::arg("token"),
             "Reports each of these actors that stops with an error to next_failure(), under `token`.");
  module.def(
      "next_failure", [](double timeout) { return failure_queue().next(timeout); }, py::arg("timeout"),
      "(token, position, actor address, reason) of the next failed watched actor, or None after `timeout` s.");
  module.def(
      "close_failures", [] { failure_queue().close(); },
      "At exit: next_failure() returns None at once from now on, and later failures are dropped.");
  module.def("watch_stopped", &watch_stopped, py::arg("refs"),
             "A CallFuture completed once every one of these actors has stopped.");
}

}  // namespace castmesh::python
