// Python view of castmesh/backend.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "castmesh/backend.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

std::string device_repr(const DeviceInfo& device) {
  return "DeviceInfo(index=" + std::to_string(device.index) + ", name='" + device.name +
         "', memory_bytes=" + std::to_string(device.memory_bytes) + ", detail='" + device.detail + "')";
}

std::string backend_repr(const BackendInfo& info) {
  return "BackendInfo(name='" + info.name + "', state='" + std::string(backend_state_name(info.state)) +
         "', devices=" + std::to_string(info.devices.size()) + ", path='" + info.path + "')";
}

}  // namespace

void bind_backends(py::module_& module) {
  py::class_<DeviceInfo>(module, "DeviceInfo", "One device a backend found.")
      .def_property_readonly("kind",
                             [](const DeviceInfo& d) {
                               switch (d.kind) {
                                 case CASTMESH_DEVICE_KIND_CUDA: return "cuda";
                                 case CASTMESH_DEVICE_KIND_HIP: return "hip";
                                 case CASTMESH_DEVICE_KIND_RDMA_NIC: return "rdma_nic";
                                 default: return "other";
                               }
                             })
      .def_readonly("index", &DeviceInfo::index)
      .def_readonly("name", &DeviceInfo::name)
      .def_readonly("memory_bytes", &DeviceInfo::memory_bytes)
      .def_readonly("detail", &DeviceInfo::detail)
      .def("__repr__", &device_repr);

  py::class_<BackendInfo>(module, "BackendInfo", "What discovery found about one backend.")
      .def_readonly("name", &BackendInfo::name)
      .def_property_readonly("state",
                             [](const BackendInfo& b) { return std::string(backend_state_name(b.state)); })
      .def_property_readonly("found",
                             [](const BackendInfo& b) { return b.state != BackendState::kLibraryMissing; },
                             "True when a library for this backend was found (it may still lack a device).")
      .def_property_readonly("available", [](const BackendInfo& b) { return b.state == BackendState::kLoaded; },
                             "True when the backend is loaded and usable.")
      .def_readonly("path", &BackendInfo::path)
      .def_readonly("version", &BackendInfo::version)
      .def_readonly("message", &BackendInfo::message)
      .def_readonly("devices", &BackendInfo::devices)
      .def("__repr__", &backend_repr);

  module.def(
      "backends", [] { return castmesh::backends(); }, py::call_guard<py::gil_scoped_release>(),
      "Every backend found (and the well-known ones not found), with its state.");
  module.def(
      "load_backend",
      [](const std::string& name_or_path) {
        absl::StatusOr<const Backend*> loaded;
        {
          py::gil_scoped_release release;
          loaded = castmesh::load_backend(name_or_path);
        }
        if (!loaded.ok()) throw_status(loaded.status(), ErrorDomain::kBackend);
        return (*loaded)->info();
      },
      py::arg("name_or_path"),
      "Loads a backend by name or library path; raises RuntimeError saying why it is unavailable.");
  module.def("add_backend_search_path", &castmesh::add_backend_search_path, py::arg("path"),
             "Adds a folder or library file to the backend search (used for plugin packages).");
}

}  // namespace castmesh::python
