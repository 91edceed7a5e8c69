// castmesh._castmesh output forwarding (castmesh/output.h): what worker
// procs write, shown in the controller (ProcMesh.logging_option).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "castmesh/output.h"
#include "castmesh/proc_mesh.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

void bind_output(py::module_& module) {
  module.def(
      "forward_output",
      [](const ProcMesh& procs, bool stream_to_client, double aggregate_window_s, uint64_t backlog_bytes) {
        OutputForwardingOptions options;
        options.stream_to_client = stream_to_client;
        options.aggregate_window = absl::Seconds(aggregate_window_s);
        options.backlog_bytes = backlog_bytes;
        py::gil_scoped_release release;
        absl::Status status = forward_output(procs, options);
        if (!status.ok()) throw_status(status, ErrorDomain::kProc);
      },
      py::arg("procs"), py::arg("stream_to_client"), py::arg("aggregate_window"), py::arg("backlog_bytes"),
      "Forwards the procs' stdout/stderr to this controller (or back to their own terminal).");
  module.def(
      "flush_forwarded_output",
      [] {
        Runtime* runtime = Runtime::current();
        if (runtime == nullptr) return;
        py::gil_scoped_release release;
        (void)flush_forwarded_output(*runtime);
      },
      "Returns once every forwarded line received so far is written.");
}

}  // namespace castmesh::python
