// absl::Status -> Python exception, for bindings whose errors users catch
// by kind: ValueError (kInvalidArgument, kOutOfRange), TimeoutError,
// NotImplementedError, PermissionError, MemoryError; any other code raises
// `fallback` (a "module.Class" of castmesh whose constructor takes
// (message, code)), so the status code's name reaches Python as `.code`
// without parsing text. Any thread; takes the GIL to raise.
#pragma once

#include "absl/status/status.h"

namespace castmesh::python {

[[noreturn]] void raise_status_as(const absl::Status& status, const char* fallback_module, const char* fallback_class);

}  // namespace castmesh::python
