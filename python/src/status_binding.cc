#include "status_binding.h"

#include <string>

namespace castmesh::python {
namespace py = pybind11;
namespace {

// The builtin exception the data-plane domains share for codes that name a
// kind of error users catch by type; nullptr for the others.
PyObject* data_plane_builtin(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return PyExc_ValueError;
    case absl::StatusCode::kDeadlineExceeded: return PyExc_TimeoutError;
    case absl::StatusCode::kUnimplemented: return PyExc_NotImplementedError;
    case absl::StatusCode::kPermissionDenied: return PyExc_PermissionError;
    case absl::StatusCode::kResourceExhausted: return PyExc_MemoryError;
    default: return nullptr;
  }
}

// A builtin exception class, or nullptr where `domain` uses a castmesh.errors
// class for `code` (named in *castmesh_class).
PyObject* exception_class(ErrorDomain domain, absl::StatusCode code, const char** castmesh_class) {
  switch (domain) {
    case ErrorDomain::kProc: *castmesh_class = "ProcError"; return nullptr;
    case ErrorDomain::kCollectives: *castmesh_class = "CommunicatorError"; return data_plane_builtin(code);
    case ErrorDomain::kRdma: *castmesh_class = "RdmaError"; return data_plane_builtin(code);
    case ErrorDomain::kTensor:
      if (code == absl::StatusCode::kInvalidArgument) return PyExc_ValueError;
      if (code == absl::StatusCode::kResourceExhausted) return PyExc_MemoryError;
      return PyExc_BufferError;
    case ErrorDomain::kShape: return code == absl::StatusCode::kNotFound ? PyExc_KeyError : PyExc_ValueError;
    case ErrorDomain::kValue: return PyExc_ValueError;
    case ErrorDomain::kBackend: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

// Sets the Python error for `error` (GIL held, inside the translator).
void raise_python(const StatusError& error) {
  const std::string code = absl::StatusCodeToString(error.status().code());
  const char* castmesh_class = nullptr;
  PyObject* builtin = exception_class(error.domain(), error.status().code(), &castmesh_class);
  try {
    py::object type = builtin != nullptr ? py::reinterpret_borrow<py::object>(builtin)
                                         : py::module_::import("castmesh.errors").attr(castmesh_class);
    py::object exception;
    if (builtin != nullptr) {
      exception = type(error.what());
      exception.attr("code") = code;  // builtin exceptions take attributes; castmesh's take the code
    } else {
      exception = type(error.what(), code);
    }
    PyErr_SetObject(type.ptr(), exception.ptr());
  } catch (py::error_already_set& failed) {
    failed.restore();  // castmesh.errors cannot be imported: that error is the clearer one
  }
}

}  // namespace

void bind_status(py::module_& /*module*/) {
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const StatusError& error) {
      raise_python(error);
    }
  });
}

}  // namespace castmesh::python
