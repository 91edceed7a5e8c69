// castmesh._castmesh.RdmaHandle and RdmaPending: the C++ RdmaBuffer for
// Python (castmesh.rdma wraps them with the Monarch-style API). Memory is
// any DLPack or buffer-protocol object, taken zero-copy; the GIL is
// released while bytes move and while waiting.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "bindings.h"
#include "castmesh/rdma.h"
#include "status_binding.h"
#include "tensor_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

[[noreturn]] void raise(const absl::Status& st) { throw_status(st, ErrorDomain::kRdma); }

template <typename T>
T value(absl::StatusOr<T> v) {
  if (!v.ok()) raise(v.status());
  return *std::move(v);
}

RdmaAccess access_of(const std::string& text) {
  if (text == "r" || text == "read") return RdmaAccess::kRead;
  if (text == "w" || text == "write") return RdmaAccess::kWrite;
  if (text == "rw" || text == "read_write") return RdmaAccess::kReadWrite;
  throw py::value_error("access must be 'r', 'w' or 'rw' (read, write, read_write), got '" + text + "'");
}

// An operation (or a batch, or a release) in flight, waited on from Python
// any number of times: wait() blocks without the GIL; on_done(cb) calls cb
// once the result is there (on a runtime thread, with the GIL).
class RdmaPending {
 public:
  using Results = std::vector<RdmaResult>;

  explicit RdmaPending(Future<Results> future) : state_(std::make_shared<State>()) {
    if (future.ready()) {  // finished in the call (a same-host one-sided copy): nothing to arm
      state_->result = future.get();
      return;
    }
    std::move(future).on_ready([state = state_](absl::StatusOr<Results> result) {
      std::vector<std::function<void()>> callbacks;
      {
        std::lock_guard lock(state->mu);
        state->result = std::move(result);
        callbacks.swap(state->callbacks);
      }
      state->cv.notify_all();
      for (auto& callback : callbacks) callback();
    });
  }

  // The results: [castmesh.rdma.RdmaResult] (device memory: transport
  // "<name>+host_staging"), raising the operation's error, or TimeoutError
  // when not done within `timeout` seconds.
  py::list wait(std::optional<double> timeout) {
    py::list out;
    for (const RdmaResult& r : results(timeout)) out.append(result_object(r));
    return out;
  }

  // wait() of a single operation: its RdmaResult.
  py::object wait_one(std::optional<double> timeout) {
    Results done = results(timeout);
    if (done.size() != 1) throw py::value_error("wait_one() of an RDMA batch; use wait()");
    return result_object(done.front());
  }

  // Calls `callback()` once done: now if it is, else from the completing thread.
  void on_done(py::function callback) {
    auto shared = std::shared_ptr<py::function>(new py::function(std::move(callback)), [](py::function* f) {
      if (!python_usable()) return;  // exiting: leak the reference
      py::gil_scoped_acquire gil;
      delete f;
    });
    auto call = [shared] {
      if (!python_usable()) return;
      py::gil_scoped_acquire gil;
      try {
        (*shared)();
      } catch (py::error_already_set& error) {
        error.discard_as_unraisable("castmesh.rdma completion callback");
      }
    };
    {
      std::lock_guard lock(state_->mu);
      if (!state_->result) {
        state_->callbacks.push_back(std::move(call));
        return;
      }
    }
    (*shared)();  // done already; this thread holds the GIL
  }

 private:
  Results results(std::optional<double> timeout) {
    std::optional<absl::StatusOr<Results>> result = done_result();
    if (!result) {
      py::gil_scoped_release release;
      std::unique_lock lock(state_->mu);
      auto done = [this] { return state_->result.has_value(); };
      if (timeout) {
        state_->cv.wait_for(lock, std::chrono::duration<double>(std::max(0.0, *timeout)), done);
      } else {
        state_->cv.wait(lock, done);
      }
      result = state_->result;
    }
    if (!result) {
      PyErr_SetString(PyExc_TimeoutError, "the RDMA operation has not finished yet");
      throw py::error_already_set();
    }
    return value(*std::move(result));
  }

  // castmesh.rdma.RdmaResult(bytes, transport), made as tuple.__new__ makes
  // it: the NamedTuple's Python-level __new__ was a sixth of a 4 KiB
  // read_into(...).get() from Python. With the GIL.
  static py::object result_object(const RdmaResult& r) {
    static PyObject* type = nullptr;  // leaked: used until exit; the GIL orders the first calls
    if (type == nullptr) type = py::object(py::module_::import("castmesh.rdma").attr("RdmaResult")).release().ptr();
    py::tuple args = py::make_tuple(py::make_tuple(r.bytes, rdma_result_transport(r)));
    PyObject* made = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(type), args.ptr(), nullptr);
    if (made == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(made);
  }

  // The result if it is there, without releasing the GIL: the completing
  // thread holds `mu` only to store it and never takes the GIL under it.
  std::optional<absl::StatusOr<Results>> done_result() const {
    std::lock_guard lock(state_->mu);
    return state_->result;
  }

  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<Results>> result;
    std::vector<std::function<void()>> callbacks;
  };
  std::shared_ptr<State> state_;
};

Future<RdmaPending::Results> as_list(Future<RdmaResult> one) {
  if (one.ready()) {  // the common same-host case: no continuation to chain
    absl::StatusOr<RdmaResult> r = one.get();
    if (!r.ok()) return make_failed_future<RdmaPending::Results>(r.status());
    return make_ready_future(RdmaPending::Results{*r});
  }
  return std::move(one).then([](RdmaResult r) { return RdmaPending::Results{r}; });
}

RdmaOptions options_of(size_t offset, std::optional<size_t> length, std::optional<double> timeout) {
  RdmaOptions options;
  options.offset = offset;
  options.length = length;
  options.timeout = timeout ? absl::Seconds(*timeout) : absl::InfiniteDuration();
  return options;
}

RdmaPending read_into(const RdmaBuffer& buffer, const py::object& dst, size_t offset, std::optional<size_t> length,
                      std::optional<double> timeout) {
  TensorView view = tensor_from_python(dst, /*writable=*/true);
  py::gil_scoped_release release;
  return RdmaPending(as_list(buffer.read_into(view, options_of(offset, length, timeout))));
}

RdmaPending write_from(const RdmaBuffer& buffer, const py::object& src, size_t offset,
                       std::optional<double> timeout) {
  TensorView view = tensor_from_python(src, /*writable=*/false);
  py::gil_scoped_release release;
  return RdmaPending(as_list(buffer.write_from(view, options_of(offset, std::nullopt, timeout))));
}

// ops: [(handle, array, is_write, offset, length or None)].
RdmaPending submit_batch(const py::list& ops, std::optional<double> timeout) {
  RdmaBatch batch;
  for (py::handle item : ops) {
    auto op = item.cast<py::tuple>();
    const auto& buffer = op[0].cast<const RdmaBuffer&>();
    const bool write = op[2].cast<bool>();
    TensorView view = tensor_from_python(op[1], /*writable=*/!write);
    RdmaOptions options = options_of(op[3].cast<size_t>(), op[4].cast<std::optional<size_t>>(), timeout);
    absl::Status added = write ? batch.add_write(buffer, view, options) : batch.add_read(buffer, view, options);
    if (!added.ok()) raise(added);
  }
  py::gil_scoped_release release;
  return RdmaPending(batch.submit(timeout ? absl::Seconds(*timeout) : absl::InfiniteDuration()));
}

}  // namespace

void bind_rdma(py::module_& m) {
  py::class_<RdmaPending>(m, "RdmaPending", "An RDMA operation in flight (castmesh.rdma wraps it in a Future).")
      .def("wait", &RdmaPending::wait, py::arg("timeout") = py::none())
      .def("wait_one", &RdmaPending::wait_one, py::arg("timeout") = py::none())
      .def("on_done", &RdmaPending::on_done, py::arg("callback"));

  py::class_<RdmaBuffer>(m, "RdmaHandle", "castmesh::RdmaBuffer: a handle on memory a proc registered.")
      .def_static(
          "register",
          [](const py::object& obj, const std::string& access) {
            const RdmaAccess a = access_of(access);
            TensorView view = tensor_from_python(obj, (static_cast<uint32_t>(a) & 2) != 0);
            return value(RdmaBuffer::register_memory(view, a));
          },
          py::arg("obj"), py::arg("access") = "rw")
      .def_static("deserialize",
                  [](const py::bytes& bytes) { return value(RdmaBuffer::deserialize(std::string(bytes))); })
      .def("serialize", [](const RdmaBuffer& b) { return py::bytes(b.serialize()); })
      .def("size", &RdmaBuffer::size)
      .def_property_readonly("owner", &RdmaBuffer::owner)
      .def_property_readonly("access", [](const RdmaBuffer& b) {
        return b.access() == RdmaAccess::kRead ? "r" : b.access() == RdmaAccess::kWrite ? "w" : "rw";
      })
      .def_property_readonly("transports", [](const RdmaBuffer& b) {
        std::vector<std::string> names;
        for (RdmaTransport t : b.transports()) names.emplace_back(rdma_transport_name(t));
        return names;
      })
      .def("read_into", &read_into, py::arg("dst"), py::arg("offset") = 0, py::arg("length") = py::none(),
           py::arg("timeout") = py::none())
      .def("write_from", &write_from, py::arg("src"), py::arg("offset") = 0, py::arg("timeout") = py::none())
      .def("release",
           [](const RdmaBuffer& b, std::optional<double> timeout) {
             py::gil_scoped_release release;
             Future<Unit> released = b.release(timeout ? absl::Seconds(*timeout) : absl::Seconds(60));
             return RdmaPending(std::move(released).then([](Unit) { return RdmaPending::Results{}; }));
           },
           py::arg("timeout") = py::none())
      .def("__repr__", &RdmaBuffer::to_string);

  m.def("rdma_submit_batch", &submit_batch, py::arg("ops"), py::arg("timeout") = py::none());
}

}  // namespace castmesh::python
