// castmesh._castmesh: the compiled half of the castmesh Python package. Built
// with pybind11_add_module (Python's Development.Module): it does not link
// libpython, and links libcastmesh_core like any other C++ program.
#include <pybind11/pybind11.h>

#include <atomic>

#include "castmesh/version.h"
#include "bindings.h"
#include "status_binding.h"

namespace castmesh::python {
namespace {
std::atomic<bool> g_python_alive{true};
}  // namespace

bool python_usable() { return g_python_alive.load(std::memory_order_acquire) && Py_IsInitialized(); }

}  // namespace castmesh::python

PYBIND11_MODULE(_castmesh, module) {
  module.doc() = "castmesh core bindings; use the castmesh package, not this module";
  // The core library's version (the one actually loaded, not the headers').
  module.attr("__version__") = castmesh::version();
  module.def("version", &castmesh::version, "Version of the loaded libcastmesh_core.");
  // Registered first, so it runs after every castmesh exit hook (atexit is
  // last in, first out): the runtime is stopped while threads may still use
  // Python, and nothing of castmesh's takes the GIL after that.
  pybind11::module_::import("atexit").attr("register")(pybind11::cpp_function(
      [] { castmesh::python::g_python_alive.store(false, std::memory_order_release); }));
  castmesh::python::bind_status(module);
  castmesh::python::bind_backends(module);
  castmesh::python::bind_shape(module);
  castmesh::python::bind_tensor(module);
  castmesh::python::bind_collectives(module);
  castmesh::python::bind_rdma(module);
  castmesh::python::bind_tensor_engine(module);
  castmesh::python::bind_call_slots(module);
  castmesh::python::bind_actor_server(module);
  castmesh::python::bind_meshes(module);
  castmesh::python::bind_runtime(module);
  castmesh::python::bind_hosts(module);
  castmesh::python::bind_output(module);
  castmesh::python::bind_trace(module);
  castmesh::python::bind_debug(module);
  castmesh::python::bind_metrics(module);
  castmesh::python::bind_channels(module);
  castmesh::python::bind_supervision(module);
  castmesh::python::bind_config(module);
}
