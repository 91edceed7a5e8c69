// castmesh._castmesh.Communicator and friends: the C++ Communicator for
// Python (castmesh.collectives wraps it with mpi4py/torch.distributed-style
// defaults). Buffers are any DLPack or buffer-protocol object, taken
// zero-copy; the GIL is released while data moves. A user-defined
// reduction is a Python function called (with the GIL) on NumPy views.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "status_binding.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"
#include "tensor_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

// The Python exception for a failed operation (status_binding.h); the
// catch-all is castmesh.collectives.CommunicatorError carrying the code.
[[noreturn]] void raise(const absl::Status& st) { throw_status(st, ErrorDomain::kCollectives); }

void check(const absl::Status& st) {
  if (!st.ok()) raise(st);
}
template <typename T>
T value(absl::StatusOr<T> v) {
  if (!v.ok()) raise(v.status());
  return *std::move(v);
}

// The DeviceOptions of a collective: `stream` is None or a castmesh.tensor_engine.Stream.
DeviceOptions device_options(const py::object& stream) {
  DeviceOptions options;
  if (!stream.is_none()) options.stream = stream.cast<DeviceStream>();
  return options;
}

// A collective's buffers. A CUDA/ROCm DLPack producer is asked with the
// stream the collective will run on (options.stream, or castmesh's consume
// stream of its device, which then becomes options.stream): the DLPack
// stream protocol.
TensorView in_view(const py::object& obj, DeviceOptions& options) {
  return obj.is_none() ? TensorView() : tensor_from_python(obj, false, &options.stream);
}
TensorView out_view(const py::object& obj, DeviceOptions& options) {
  return obj.is_none() ? TensorView() : tensor_from_python(obj, true, &options.stream);
}
// A reduction's input and output. castmesh.collectives passes the input as
// the output for the in-place default: one writable import then serves both
// (the second import was about a fifth of a 1 KiB allreduce's cost from
// Python), and no second view is made (each TensorView allocates its shape
// and strides).
class ReductionViews {
 public:
  ReductionViews(const py::object& in, const py::object& out, DeviceOptions& options) {
    if (!in.is_none() && in.is(out)) {
      out_ = out_view(out, options);
      return;
    }
    in_ = in_view(in, options);
    out_ = out_view(out, options);
  }
  const TensorView& in() const { return in_ ? *in_ : *out_; }
  const TensorView& out() const { return *out_; }

 private:
  std::optional<TensorView> in_;   // empty when the output is the input
  std::optional<TensorView> out_;
};

// NumPy's view of `count` elements of `dtype` at `data` (the reduction's buffers).
py::object numpy_view(py::module_& np, const void* data, size_t count, DType dtype, bool writable) {
  TensorView view = TensorView::Contiguous(const_cast<void*>(data), dtype, {static_cast<int64_t>(count)}, nullptr,
                                           !writable);
  return np.attr("from_dlpack")(tensor_to_python(view));
}

// op: a name ("sum", ...) or a castmesh.collectives.Op (function + commutative).
ReduceSpec reduce_spec(const py::object& op) {
  if (PyUnicode_Check(op.ptr())) {
    // Read in place: no std::string per call for the op most calls name.
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(op.ptr(), &size);
    if (utf8 == nullptr) throw py::error_already_set();
    const std::string_view name(utf8, static_cast<size_t>(size));
    std::optional<ReduceOp> builtin = reduce_op_from_name(name);
    if (!builtin) throw py::value_error(absl::StrCat("unknown reduction '", std::string(name), "' (sum, prod, min, max, avg, band, bor, bxor, land, lor, lxor, or a castmesh.collectives.Op)"));
    return *builtin;
  }
  py::object fn = op.attr("fn");
  const bool commutative = op.attr("commutative").cast<bool>();
  const std::string name = py::str(op.attr("name"));
  // Holds `fn` for as long as the op is in use; released under the GIL.
  auto holder = std::shared_ptr<py::object>(new py::object(fn), [](py::object* o) {
    if (!python_usable()) {  // exiting: leak the reference (see python_usable)
      (void)o->release();
      delete o;
      return;
    }
    py::gil_scoped_acquire gil;
    delete o;
  });
  ReduceFn call = [holder](const void* in, void* inout, size_t count, DType dtype) {
    py::gil_scoped_acquire gil;
    py::module_ np = py::module_::import("numpy");
    py::object a = numpy_view(np, in, count, dtype, false);
    py::object b = numpy_view(np, inout, count, dtype, true);
    py::object result = (*holder)(a, b);
    if (!result.is_none() && !result.is(b)) b.attr("__setitem__")(py::ellipsis(), result);
  };
  return CustomReduceOp{name, std::move(call), commutative};
}

py::object status_object(const MessageStatus& s) {
  return py::module_::import("castmesh.collectives").attr("Status")(s.source, s.tag, s.bytes);
}

// Waits without the GIL.
py::object wait_request(const Request& r, std::optional<double> timeout) {
  absl::StatusOr<MessageStatus> result;
  {
    py::gil_scoped_release release;
    result = r.wait(timeout ? absl::Seconds(*timeout) : absl::InfiniteDuration());
  }
  return status_object(value(std::move(result)));
}

// Runs `f` on `comm` without the GIL.
template <typename F>
auto unlocked(F f) {
  py::gil_scoped_release release;
  return f();
}

void bind_request(py::module_& m) {
  py::class_<Request>(m, "Request", "A non-blocking communicator operation in flight.")
      .def("wait", &wait_request, py::arg("timeout") = py::none(),
           "Blocks until done (TimeoutError after `timeout` seconds; the operation stays pending); "
           "returns its Status.")
      .def("test", [](const Request& r) { return r.test().has_value(); }, "True once complete (never blocks).")
      .def("wait_stream", [](const Request& r, const DeviceStream& stream) {
        check(unlocked([&] { return r.wait_stream(stream); }));
      }, py::arg("stream"),
           "Device work: `stream`'s later work runs after this operation, without blocking the CPU; "
           "a host operation is waited for.")
      .def_static("wait_all",
                  [](const std::vector<Request>& rs, std::optional<double> timeout) {
                    check(unlocked([&] {
                      return Request::wait_all(rs, timeout ? absl::Seconds(*timeout) : absl::InfiniteDuration());
                    }));
                  },
                  py::arg("requests"), py::arg("timeout") = py::none())
      .def_static("wait_any",
                  [](const std::vector<Request>& rs, std::optional<double> timeout) {
                    return value(unlocked([&] {
                      return Request::wait_any(rs, timeout ? absl::Seconds(*timeout) : absl::InfiniteDuration());
                    }));
                  },
                  py::arg("requests"), py::arg("timeout") = py::none());
}

absl::Duration duration(std::optional<double> seconds) {
  return seconds ? absl::Seconds(*seconds) : absl::InfiniteDuration();
}

// Bytes [offset, offset + nbytes) of a buffer-protocol object's C-contiguous
// buffer, held for a blocking call (castmesh.MPI's Send/Recv): a Py_buffer on
// the stack and a one-dimensional byte view, with no owner, shape or copy
// (tensor_from_python's general import costs an allocation and a shared
// owner per call, a measurable part of a small message's time from Python).
// nbytes -1: to the buffer's end. A buffer that is not C-contiguous, or
// read-only for a receive, raises BufferError before anything moves (the
// caller then takes its general path, which says why). Needs the GIL.
class HeldBytes {
 public:
  HeldBytes(py::handle obj, Py_ssize_t offset, Py_ssize_t nbytes, bool writable) {
    if (PyObject_GetBuffer(obj.ptr(), &buffer_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      PyErr_Clear();  // whatever the exporter said, the general path says it mpi4py's way
      throw py::buffer_error("no C-contiguous" + std::string(writable ? " writable" : "") + " buffer");
    }
    held_ = true;
    if (nbytes < 0) nbytes = buffer_.len - offset;
    if (offset < 0 || nbytes < 0 || offset > buffer_.len || nbytes > buffer_.len - offset) {
      throw py::value_error(absl::StrCat("message: buffer too small: bytes ", offset, "..", offset + nbytes,
                                         " of a buffer of ", buffer_.len));
    }
    view_ = TensorView::Contiguous(static_cast<char*>(buffer_.buf) + offset, DType::kUInt8, {nbytes});
  }
  ~HeldBytes() {
    if (held_) PyBuffer_Release(&buffer_);
  }
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;
  const TensorView& view() const { return view_; }

 private:
  Py_buffer buffer_{};
  bool held_ = false;
  TensorView view_;
};

void bind_point_to_point(py::class_<Communicator>& c) {
  // castmesh.MPI's blocking Send/Recv (python/castmesh/_mpi/p2p.py): a byte
  // range of a buffer-protocol object, positional arguments only; recv_bytes
  // returns (source, tag, bytes) as a plain tuple.
  c.def("send_bytes", [](const Communicator& comm, py::handle buf, Py_ssize_t offset, Py_ssize_t nbytes, int dest,
                         int tag) {
     HeldBytes bytes(buf, offset, nbytes, false);
     check(unlocked([&] { return comm.send(bytes.view(), dest, tag); }));
   })
      .def("recv_bytes", [](const Communicator& comm, py::handle buf, Py_ssize_t offset, Py_ssize_t nbytes,
                            int source, int tag) {
        HeldBytes bytes(buf, offset, nbytes, true);
        const MessageStatus s = value(unlocked([&] { return comm.recv(bytes.view(), source, tag); }));
        return py::make_tuple(s.source, s.tag, s.bytes);
      });
  c.def("send", [](const Communicator& comm, const py::object& buf, int dest, int tag) {
     TensorView v = tensor_from_python(buf, false);
     check(unlocked([&] { return comm.send(v, dest, tag); }));
   }, py::arg("buf"), py::arg("dest"), py::arg("tag") = 0)
      .def("isend", [](const Communicator& comm, const py::object& buf, int dest, int tag) {
        TensorView v = tensor_from_python(buf, false);
        return unlocked([&] { return comm.isend(v, dest, tag); });
      }, py::arg("buf"), py::arg("dest"), py::arg("tag") = 0)
      .def("recv", [](const Communicator& comm, const py::object& buf, int source, int tag, std::optional<double> timeout) {
        TensorView v = tensor_from_python(buf, true);
        return status_object(value(unlocked([&] { return comm.recv(v, source, tag, duration(timeout)); })));
      }, py::arg("buf"), py::arg("source") = kAnySource, py::arg("tag") = kAnyTag, py::arg("timeout") = py::none())
      .def("irecv", [](const Communicator& comm, const py::object& buf, int source, int tag) {
        TensorView v = tensor_from_python(buf, true);
        return comm.irecv(v, source, tag);
      }, py::arg("buf"), py::arg("source") = kAnySource, py::arg("tag") = kAnyTag)
      .def("probe", [](const Communicator& comm, int source, int tag, std::optional<double> timeout) {
        return status_object(value(unlocked([&] { return comm.probe(source, tag, duration(timeout)); })));
      }, py::arg("source") = kAnySource, py::arg("tag") = kAnyTag, py::arg("timeout") = py::none())
      .def("iprobe", [](const Communicator& comm, int source, int tag) -> py::object {
        std::optional<MessageStatus> s = comm.iprobe(source, tag);
        return s ? status_object(*s) : py::none();
      }, py::arg("source") = kAnySource, py::arg("tag") = kAnyTag);
}

// Binds name (blocking) and "i" + name (a Request) for one collective:
// `call(comm, views..., nonblocking)` returns a Request either way.
void bind_collectives(py::class_<Communicator>& c) {
  c.def("barrier", [](const Communicator& comm, bool async_op) -> py::object {
     if (async_op) return py::cast(comm.ibarrier());
     check(unlocked([&] { return comm.barrier(); }));
     return py::none();
   }, py::arg("async_op") = false)
      .def("allreduce", [](const Communicator& comm, const py::object& in, const py::object& out, const py::object& op, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        const ReductionViews views(in, out, options);
        const TensorView &i = views.in(), &o = views.out();
        ReduceSpec spec = reduce_spec(op);
        if (async_op) return py::cast(comm.iallreduce(i, o, spec, options));
        check(unlocked([&] { return comm.allreduce(i, o, spec, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("op"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("reduce", [](const Communicator& comm, const py::object& in, const py::object& out, const py::object& op, int root, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        const ReductionViews views(in, out, options);
        const TensorView &i = views.in(), &o = views.out();
        ReduceSpec spec = reduce_spec(op);
        if (async_op) return py::cast(comm.ireduce(i, o, spec, root, options));
        check(unlocked([&] { return comm.reduce(i, o, spec, root, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("op"), py::arg("root"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("broadcast", [](const Communicator& comm, const py::object& buf, int root, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView v = comm.rank() == root ? in_view(buf, options) : out_view(buf, options);
        if (async_op) return py::cast(comm.ibroadcast(v, root, options));
        check(unlocked([&] { return comm.broadcast(v, root, options); }));
        return py::none();
      }, py::arg("buf"), py::arg("root"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("allgather", [](const Communicator& comm, const py::object& in, const py::object& out, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView i = in_view(in, options), o = out_view(out, options);
        if (async_op) return py::cast(comm.iallgather(i, o, options));
        check(unlocked([&] { return comm.allgather(i, o, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("gather", [](const Communicator& comm, const py::object& in, const py::object& out, int root, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView i = in_view(in, options), o = out_view(out, options);
        if (async_op) return py::cast(comm.igather(i, o, root, options));
        check(unlocked([&] { return comm.gather(i, o, root, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("root"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("scatter", [](const Communicator& comm, const py::object& in, const py::object& out, int root, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView i = in_view(in, options), o = out_view(out, options);
        if (async_op) return py::cast(comm.iscatter(i, o, root, options));
        check(unlocked([&] { return comm.scatter(i, o, root, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("root"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("reduce_scatter", [](const Communicator& comm, const py::object& in, const py::object& out, const py::object& op, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView i = in_view(in, options), o = out_view(out, options);
        ReduceSpec spec = reduce_spec(op);
        if (async_op) return py::cast(comm.ireduce_scatter(i, o, spec, options));
        check(unlocked([&] { return comm.reduce_scatter(i, o, spec, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("op"), py::arg("async_op") = false, py::arg("stream") = py::none())
      .def("alltoall", [](const Communicator& comm, const py::object& in, const py::object& out, bool async_op, const py::object& stream) -> py::object {
        DeviceOptions options = device_options(stream);
        TensorView i = in_view(in, options), o = out_view(out, options);
        if (async_op) return py::cast(comm.ialltoall(i, o, options));
        check(unlocked([&] { return comm.alltoall(i, o, options); }));
        return py::none();
      }, py::arg("input"), py::arg("output"), py::arg("async_op") = false, py::arg("stream") = py::none());
}

}  // namespace

void bind_collectives(py::module_& module) {
  bind_request(module);
  module.attr("ANY_SOURCE") = kAnySource;
  module.attr("ANY_TAG") = kAnyTag;
  module.attr("UNDEFINED") = kUndefined;
  py::class_<Communicator> c(module, "Communicator", "castmesh::Communicator (see castmesh.collectives).");
  c.def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("id", &Communicator::id)
      .def_property_readonly("dims", [](const Communicator& comm) {
        py::dict dims;
        for (size_t d = 0; d < comm.shape().ndim(); ++d) dims[py::str(comm.shape().labels()[d])] = comm.shape().sizes()[d];
        return dims;
      })
      .def("along", [](const Communicator& comm, const std::vector<std::string>& dims) { return value(comm.along(dims)); })
      .def("split", [](const Communicator& comm, int color, int key) -> py::object {
        auto sub = value(unlocked([&] { return comm.split(color, key); }));
        return sub ? py::cast(*sub) : py::none();
      }, py::arg("color"), py::arg("key") = 0)
      .def("dup", [](const Communicator& comm) { return value(unlocked([&] { return comm.dup(); })); });
  bind_point_to_point(c);
  bind_collectives(c);
  module.def(
      "data_path_bytes",
      [] {
        const DataPathBytes bytes = data_path_bytes();
        py::dict out;
        out["shared_memory"] = bytes.shared_memory;
        out["single_copy"] = bytes.single_copy;
        out["socket"] = bytes.socket;
        return out;
      },
      "Body bytes this process's collectives moved by each data path since it started.");
  module.def("current_communicator", [] { return value(Communicator::current()); },
             "The communicator of the actor mesh whose endpoint runs on this thread.");
  module.def("world_communicator", [](const std::string& rendezvous, const std::string& secret, double timeout) {
    WorldOptions options{rendezvous, secret, absl::Seconds(timeout)};
    return value(unlocked([&] { return Communicator::world(options); }));
  }, py::arg("rendezvous") = "", py::arg("secret") = "", py::arg("timeout") = 60.0);
}

}  // namespace castmesh::python
