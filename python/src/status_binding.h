// absl::Status -> Python exception: the one translation every binding uses.
// A binding throws StatusError (throw_status, value_or_throw); the translator
// that bind_status registers raises the exception the error's domain names
// for its code and sets the code's name ("UNAVAILABLE") as the exception's
// `.code`, so Python reads the code and never parses "CODE: msg" text.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace castmesh::python {

// Which Python exceptions a binding's statuses become (the tables are in
// status_binding.cc).
enum class ErrorDomain {
  // castmesh.errors.ProcError for every code: procs, actors, meshes, channels.
  kProc,
  // ValueError (INVALID_ARGUMENT, OUT_OF_RANGE), TimeoutError, NotImplementedError, PermissionError,
  // MemoryError (RESOURCE_EXHAUSTED); any other code castmesh.errors.CommunicatorError.
  kCollectives,
  // The same builtins as kCollectives; any other code castmesh.errors.RdmaError.
  kRdma,
  // ValueError (INVALID_ARGUMENT), MemoryError (RESOURCE_EXHAUSTED); any other code BufferError, what
  // DLPack and buffer-protocol consumers expect.
  kTensor,
  // KeyError (NOT_FOUND: an unknown dimension name); any other code ValueError.
  kShape,
  // ValueError for every code: malformed input (an address, a selection).
  kValue,
  // RuntimeError for every code (a backend that cannot be loaded).
  kBackend,
};

// A failed status on its way to Python; thrown by bindings on the calling
// Python thread (GIL held or released), turned into a Python exception by
// the translator when it leaves the bound function.
class StatusError : public std::exception {
 public:
  // `status` must not be OK.
  StatusError(absl::Status status, ErrorDomain domain) : status_(std::move(status)), domain_(domain) {}
  // The status message (without the code).
  const char* what() const noexcept override { return message_.c_str(); }
  // The status as thrown.
  const absl::Status& status() const { return status_; }
  // The exception family to raise.
  ErrorDomain domain() const { return domain_; }

 private:
  absl::Status status_;
  ErrorDomain domain_;
  std::string message_{status_.message()};
};

// Throws StatusError{status, domain}; any thread a binding runs on.
[[noreturn]] inline void throw_status(absl::Status status, ErrorDomain domain) {
  throw StatusError(std::move(status), domain);
}

// The value, or throws its status as `domain`'s exception.
template <typename T>
T value_or_throw(absl::StatusOr<T> value, ErrorDomain domain) {
  if (!value.ok()) throw_status(std::move(value).status(), domain);
  return *std::move(value);
}

// Registers the translator; module.cc calls it first, before any binding.
void bind_status(pybind11::module_& module);

}  // namespace castmesh::python
