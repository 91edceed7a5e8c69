// castmesh._castmesh's device half (castmesh.tensor_engine wraps it): the
// tensor_engine backend's devices, streams, device memory and copies
// (castmesh/tensor_engine.h). Without the backend every call raises
// RuntimeError naming how to install it; bad arguments raise ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "castmesh/backend.h"
#include "castmesh/tensor_engine.h"
#include "status_binding.h"
#include "tensor_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

[[noreturn]] void raise(const absl::Status& st) {
  throw_status(st, st.code() == absl::StatusCode::kInvalidArgument ? ErrorDomain::kValue : ErrorDomain::kBackend);
}

template <typename T>
T value(absl::StatusOr<T> v) {
  if (!v.ok()) raise(v.status());
  return *std::move(v);
}

// "cuda", "cuda:1", "rocm:0" -> Device.
Device parse_device(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos && !absl::SimpleAtoi(text.substr(colon + 1), &index)) index = -1;
  if ((kind != "cuda" && kind != "rocm") || index < 0) {
    throw py::value_error(absl::StrCat("device '", text, "': expected 'cuda', 'cuda:N', 'rocm' or 'rocm:N'"));
  }
  return Device{kind == "cuda" ? DeviceKind::kCuda : DeviceKind::kRocm, index};
}

DType parse_dtype(const std::string& name) {
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype) throw py::value_error(absl::StrCat("unknown dtype '", name, "'"));
  return *dtype;
}

}  // namespace

void bind_tensor_engine(py::module_& module) {
  py::class_<DeviceStream>(module, "DeviceStream", "A stream of the tensor_engine backend (castmesh.tensor_engine.Stream).")
      .def(py::init([](const std::string& device) { return value(DeviceStream::Create(parse_device(device))); }),
           py::arg("device"), "A new stream on `device` ('cuda:0').")
      .def_static("from_native", [](const std::string& device, uintptr_t native) {
        return value(DeviceStream::FromNative(parse_device(device), native));
      }, py::arg("device"), py::arg("native"),
         "A Stream for a stream the runtime made elsewhere (torch.cuda.current_stream().cuda_stream, "
         "cupy's stream.ptr; 1/2 CUDA's legacy/per-thread default): castmesh enqueues on it, never destroys it.")
      .def_property_readonly("device", [](const DeviceStream& s) { return s.device().to_string(); })
      .def_property_readonly("native_handle", [](const DeviceStream& s) { return value(s.native_handle()); },
         "The runtime's stream as an integer (what __dlpack__(stream=...) takes; torch.cuda.ExternalStream).")
      .def("synchronize", [](const DeviceStream& s) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = s.synchronize();
        }
        if (!st.ok()) raise(st);
      }, "Blocks until the work enqueued so far has completed.")
      .def("query", [](const DeviceStream& s) { return value(s.query()); },
           "True when the work enqueued so far has completed.");
  py::class_<DeviceEvent>(module, "DeviceEvent", "An event of the tensor_engine backend (castmesh.tensor_engine.Event).")
      .def(py::init([](const std::string& device) { return value(DeviceEvent::Create(parse_device(device))); }),
           py::arg("device"), "A new event on `device` ('cuda:0').")
      .def_property_readonly("device", [](const DeviceEvent& e) { return e.device().to_string(); })
      .def("record", [](const DeviceEvent& e, const DeviceStream& s) {
        if (absl::Status st = e.record(s); !st.ok()) raise(st);
      }, py::arg("stream"), "Captures the work enqueued on `stream` so far.")
      .def("query", [](const DeviceEvent& e) { return value(e.query()); }, "True once the captured work completed.")
      .def("synchronize", [](const DeviceEvent& e) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = e.synchronize();
        }
        if (!st.ok()) raise(st);
      }, "Blocks until the captured work completed.")
      .def("wait", [](const DeviceEvent& e, const DeviceStream& s) {
        if (absl::Status st = e.order_before(s); !st.ok()) raise(st);
      }, py::arg("stream"), "Work enqueued on `stream` after this call waits for the event (no host wait).");
  module.def("te_devices", [] {
    py::list out;
    for (const DeviceInfo& d : value(device_list())) {
      py::dict info;
      info["kind"] = d.kind == CASTMESH_DEVICE_KIND_HIP ? "rocm" : "cuda";
      info["index"] = d.index;
      info["name"] = d.name;
      info["memory_bytes"] = d.memory_bytes;
      info["detail"] = d.detail;
      out.append(info);
    }
    return out;
  }, "The tensor_engine backend's devices (RuntimeError with the install hint without it).");
  module.def("te_empty", [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    return tensor_to_python(value(device_empty(parse_dtype(dtype), shape, parse_device(device))));
  }, py::arg("shape"), py::arg("dtype"), py::arg("device"), "Uninitialised device memory as a castmesh.Tensor.");
  module.def("te_copy", [](const py::object& dst, const py::object& src, const DeviceStream& stream) {
    TensorView d = tensor_from_python(dst, true);
    TensorView s = tensor_from_python(src, false);
    absl::Status st;
    {
      py::gil_scoped_release release;
      st = device_copy(d, s, stream);
    }
    if (!st.ok()) raise(st);
  }, py::arg("dst"), py::arg("src"), py::arg("stream"), "Copies src into dst in the order of `stream`.");
}

}  // namespace castmesh::python
