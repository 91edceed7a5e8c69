// castmesh._castmesh.CallFuture and MeshCallFuture (call_slot.h).
#include "call_slot.h"

namespace castmesh::python {
namespace py = pybind11;

void bind_call_slots(py::module_& module) {
  py::class_<CallFuture, std::shared_ptr<CallFuture>>(module, "CallFuture",
                                                      "Pending answer of one call (use castmesh.Future).")
      .def("wait", &CallFuture::wait, py::arg("timeout") = -1.0,
           "The payload bytes, or None when not done within `timeout` (< 0: no limit); raises ProcError.")
      .def("add_callback", &CallFuture::add_callback, py::arg("callback"),
           "callback() runs on the completing thread, with the GIL, once the call completes.");
  py::class_<MeshCallFuture, std::shared_ptr<MeshCallFuture>>(
      module, "MeshCallFuture", "Pending answers of a mesh call: a list of payloads in row-major order.")
      .def("wait", &MeshCallFuture::wait, py::arg("timeout") = -1.0,
           "The list of payload bytes, or None when not done within `timeout` (< 0: no limit); raises ProcError.")
      .def("add_callback", &MeshCallFuture::add_callback, py::arg("callback"));
}

}  // namespace castmesh::python
