#include "status_binding.h"

#include <pybind11/pybind11.h>

#include <string>

namespace castmesh::python {
namespace py = pybind11;

[[noreturn]] void raise_status_as(const absl::Status& status, const char* fallback_module,
                                  const char* fallback_class) {
  const std::string text(status.message());
  py::gil_scoped_acquire gil;
  PyObject* builtin = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: builtin = PyExc_ValueError; break;
    case absl::StatusCode::kDeadlineExceeded: builtin = PyExc_TimeoutError; break;
    case absl::StatusCode::kUnimplemented: builtin = PyExc_NotImplementedError; break;
    case absl::StatusCode::kPermissionDenied: builtin = PyExc_PermissionError; break;
    case absl::StatusCode::kResourceExhausted: builtin = PyExc_MemoryError; break;
    default: break;
  }
  if (builtin != nullptr) {
    PyErr_SetString(builtin, text.c_str());
    throw py::error_already_set();
  }
  py::object error = py::module_::import(fallback_module).attr(fallback_class);
  PyErr_SetObject(error.ptr(), py::make_tuple(text, absl::StatusCodeToString(status.code())).ptr());
  throw py::error_already_set();
}

}  // namespace castmesh::python
