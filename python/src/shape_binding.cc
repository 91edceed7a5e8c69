// Python view of castmesh/shape.h: the Shape/Slice algebra behind
// castmesh.Shape, ProcMesh.slice() and ValueMesh.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "castmesh/shape.h"
#include "bindings.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

// KeyError for an unknown dimension, ValueError otherwise (ErrorDomain::kShape).
template <typename T>
T value_or_raise(absl::StatusOr<T> value) {
  return value_or_throw(std::move(value), ErrorDomain::kShape);
}

}  // namespace

void bind_shape(py::module_& module) {
  py::class_<Shape>(module, "Shape", "Named dimensions over a strided set of ranks (castmesh::Shape).")
      .def(py::init([](const std::vector<std::pair<std::string, size_t>>& dims) {
             return value_or_raise(Shape::Create(dims));
           }),
           py::arg("dims"), "A row-major shape from (name, size) pairs, outermost first.")
      .def_static(
          "from_slice",
          [](std::vector<std::string> labels, size_t offset, std::vector<size_t> sizes, std::vector<size_t> strides) {
            Slice slice = value_or_raise(Slice::Create(offset, std::move(sizes), std::move(strides)));
            return value_or_raise(Shape::Create(std::move(labels), std::move(slice)));
          },
          py::arg("labels"), py::arg("offset"), py::arg("sizes"), py::arg("strides"))
      .def_property_readonly("labels", &Shape::labels)
      .def_property_readonly("sizes", [](const Shape& s) { return s.sizes(); })
      .def_property_readonly("offset", [](const Shape& s) { return s.slice().offset(); })
      .def_property_readonly("strides", [](const Shape& s) { return s.slice().strides(); })
      .def_property_readonly("size", &Shape::size)
      .def("ranks", [](const Shape& s) { return s.slice().ranks(); }, "Base ranks in row-major order.")
      .def(
          "select_index",
          [](const Shape& s, const std::string& name, int64_t index) {
            return value_or_raise(s.select(name, index));
          },
          py::arg("name"), py::arg("index"))
      .def(
          "select_range",
          [](const Shape& s, const std::string& name, int64_t start, int64_t stop, int64_t step) {
            // Indices as given: castmesh.Shape normalises Python's negative
            // indices first; a negative one here is an error, not "to the end".
            return value_or_raise(s.select(name, Range(start, stop, step)));
          },
          py::arg("name"), py::arg("start"), py::arg("stop"), py::arg("step"))
      .def(
          "reshape",
          [](const Shape& s, std::vector<std::pair<std::string, size_t>> dims) {
            return value_or_raise(s.reshape(std::move(dims)));
          },
          py::arg("dims"), "The same ranks in the same order under new (name, size) dimensions, without copying.")
      .def(
          "point_at",
          [](const Shape& s, size_t position) {
            Point p = value_or_raise(s.point_at(position));
            return std::make_pair(p.coords(), p.rank());
          },
          py::arg("position"), "(coordinates, base rank) of the point at a row-major position.")
      .def("__eq__", [](const Shape& a, const Shape& b) { return a == b; })
      .def("__str__", &Shape::to_string)
      .def("__repr__", [](const Shape& s) { return "Shape(" + s.to_string() + ")"; });
}

}  // namespace castmesh::python
