// CallSlot: the pending result of a call, shared by the C++ completion
// callback and Python (castmesh._castmesh.CallFuture / MeshCallFuture, which
// castmesh.Future wraps).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bindings.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/future.h"
#include "castmesh/value_mesh.h"
#include "status_binding.h"

namespace castmesh::python {

// Python's view of a result: bytes, or a list of bytes (row-major) for a mesh.
inline pybind11::object to_python(const std::string& value) { return pybind11::bytes(value); }
inline pybind11::object to_python(const ValueMesh<std::string>& mesh) {
  pybind11::list out;
  for (const std::string& v : mesh.values()) out.append(pybind11::bytes(v));
  return out;
}

// The result of one call (T = std::string) or of a mesh call (T =
// ValueMesh<std::string>). Completed once, from any thread; Python waits on
// it (GIL released) or registers callbacks, which run on the completing
// thread with the GIL taken.
template <typename T>
class CallSlot {
 public:
  // Runs alone (the last reference is gone), so without the lock.
  ~CallSlot() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (callbacks_.empty()) return;
    if (python_usable()) {
      pybind11::gil_scoped_acquire gil;
      callbacks_.clear();
    } else {
      for (auto& cb : callbacks_) cb.release();
    }
  }

  // Stores the result and runs the callbacks; later calls are ignored. Any thread.
  void complete(absl::StatusOr<T> result) {
    std::vector<pybind11::object> callbacks;
    {
      detail::MutexLock lock(mu_);
      if (done_) return;
      result_ = std::move(result);
      done_ = true;
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    if (callbacks.empty()) return;
    if (!python_usable()) {
      for (auto& cb : callbacks) cb.release();
      return;
    }
    pybind11::gil_scoped_acquire gil;
    for (auto& cb : callbacks) {
      try {
        cb();
      } catch (pybind11::error_already_set& error) {
        error.discard_as_unraisable("castmesh future callback");
      }
    }
    callbacks.clear();
  }

  // The result (bytes, or a list of bytes for a mesh call), None when not
  // done within `timeout` seconds (negative: no limit); a failed call
  // raises ProcError with its status code. Python thread, GIL held (it is
  // released while waiting); without a limit it wakes every 100 ms to run
  // Python's signal handlers, so Ctrl-C interrupts a wait (KeyboardInterrupt).
  pybind11::object wait(double timeout) {
    bool done = false;
    for (;;) {
      const bool bounded = timeout >= 0;
      const double chunk = bounded ? timeout : 0.1;
      {
        pybind11::gil_scoped_release release;
        detail::MutexLock lock(mu_);
        if (chunk > 0) cv_.wait_for(lock, absl::Seconds(chunk), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; });
        done = done_;
      }
      if (done || bounded) break;
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    }
    if (!done) return pybind11::none();
    if (!result_.ok()) throw_status(result_.status(), ErrorDomain::kProc);
    return to_python(*result_);
  }

  // Runs `callback()` once the call completes (now if it has). Python thread, GIL held.
  void add_callback(pybind11::object callback) {
    {
      detail::MutexLock lock(mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }

 private:
  detail::Mutex mu_;
  detail::CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // set once; result_ is read after seeing it
  absl::StatusOr<T> result_;                  // written once under mu_ before done_
  std::vector<pybind11::object> callbacks_ ABSL_GUARDED_BY(mu_);
};
// A call to one actor (castmesh._castmesh.CallFuture).
using CallFuture = CallSlot<std::string>;
// A call to every member of a mesh (castmesh._castmesh.MeshCallFuture).
using MeshCallFuture = CallSlot<ValueMesh<std::string>>;

// A slot completed by `future`. Any thread.
template <typename T>
std::shared_ptr<CallSlot<T>> track(Future<T> future) {
  auto slot = std::make_shared<CallSlot<T>>();
  std::move(future).on_ready([slot](absl::StatusOr<T> result) { slot->complete(std::move(result)); });
  return slot;
}

}  // namespace castmesh::python
