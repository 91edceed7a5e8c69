// castmesh._castmesh: the compiled half of the castmesh Python package. Built
// with pybind11_add_module (Python's Development.Module): it does not link
// libpython, and links libcastmesh_core like any other C++ program.
#include <pybind11/pybind11.h>

#include "castmesh/version.h"
#include "bindings.h"

PYBIND11_MODULE(_castmesh, module) {
  module.doc() = "castmesh core bindings; use the castmesh package, not this module";
  // The core library's version (the one actually loaded, not the headers').
  module.attr("__version__") = castmesh::version();
  module.def("version", &castmesh::version, "Version of the loaded libcastmesh_core.");
  castmesh::python::bind_backends(module);
  castmesh::python::bind_shape(module);
  castmesh::python::bind_tensor(module);
  castmesh::python::bind_collectives(module);
  castmesh::python::bind_actors(module);
}
