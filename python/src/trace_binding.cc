// castmesh._castmesh traces (castmesh/trace.h): start/stop across the procs
// of this controller, and the recorder calls castmesh.trace's user spans make.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "castmesh/runtime.h"
#include "castmesh/trace.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

void bind_trace(py::module_& module) {
  module.def(
      "trace_start",
      [](const std::string& path) {
        py::gil_scoped_release release;
        Runtime* runtime = Runtime::current();
        absl::Status status = runtime != nullptr ? trace::start(*runtime, path) : trace::start(path);
        if (!status.ok()) throw_status(status, ErrorDomain::kProc);
      },
      py::arg("path"), "Starts a trace in this process and its procs (castmesh.trace.start).");
  module.def(
      "trace_stop",
      [](double timeout_s) {
        absl::StatusOr<trace::TraceSummary> summary;
        {
          py::gil_scoped_release release;
          Runtime* runtime = Runtime::current();
          summary = runtime != nullptr ? trace::stop(*runtime, absl::Seconds(timeout_s)) : trace::stop();
        }
        if (!summary.ok()) throw_status(summary.status(), ErrorDomain::kProc);
        py::dict out;
        out["path"] = summary->path;
        out["procs"] = summary->procs;
        out["records"] = summary->records;
        out["dropped"] = summary->dropped;
        out["unanswered"] = summary->unanswered;
        return out;
      },
      py::arg("timeout"), "Stops the trace, gathers every proc's records and writes the file.");
  module.def("trace_recording", &trace::recording, "Whether this process records a trace now.");
  module.def("trace_now_ns", &trace::clock_ns, "The trace clock (CLOCK_MONOTONIC, ns).");
  module.def(
      "trace_user_slice",
      [](const std::string& name, int64_t start_ns, int64_t end_ns) { trace::record_span(name, start_ns, end_ns); },
      py::arg("name"), py::arg("start_ns"), py::arg("end_ns"), "Records a user span (castmesh.span).");
}

}  // namespace castmesh::python
