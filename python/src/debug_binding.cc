// castmesh._castmesh stack dumps (castmesh/debug.h; python/castmesh/debug.py
// wraps them): dumps as plain dicts and the faulthandler hook of this
// process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "castmesh/debug.h"
#include "castmesh/proc_mesh.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

debug::StackOptions options_of(double timeout_s, bool file_lines) {
  if (!(timeout_s > 0)) throw py::value_error("timeout must be a positive number of seconds");
  debug::StackOptions options;
  options.timeout = absl::Seconds(timeout_s);
  options.file_lines = file_lines;
  return options;
}

py::dict to_dict(const debug::ProcStacks& p) {
  py::list threads;
  for (const debug::ThreadStack& t : p.threads) {
    py::list native;
    for (const debug::NativeFrame& f : t.native) {
      native.append(py::dict(py::arg("pc") = f.pc, py::arg("function") = f.function, py::arg("object") = f.object,
                             py::arg("offset") = f.offset, py::arg("file") = f.file, py::arg("line") = f.line));
    }
    py::object python = py::none();
    if (t.has_python) {
      py::list frames;
      for (const debug::PythonFrame& f : t.python) {
        frames.append(py::dict(py::arg("file") = f.file, py::arg("line") = f.line, py::arg("function") = f.function));
      }
      python = frames;
    }
    threads.append(py::dict(py::arg("tid") = t.tid, py::arg("name") = t.name, py::arg("answered") = t.answered,
                            py::arg("native") = native, py::arg("python") = python,
                            py::arg("python_truncated") = t.python_truncated, py::arg("actor") = t.actor,
                            py::arg("actor_class") = t.actor_class, py::arg("message_type") = t.message_type));
  }
  return py::dict(py::arg("rank") = p.proc.rank, py::arg("proc_id") = p.proc.id, py::arg("pid") = p.pid,
                  py::arg("hostname") = p.proc.hostname,
                  py::arg("error") = p.status.ok() ? py::object(py::none()) : py::str(p.status.ToString()),
                  py::arg("python_error") = p.python_error, py::arg("threads") = threads,
                  py::arg("text") = debug::to_string(p));
}

}  // namespace

void bind_debug(py::module_& module) {
  module.def(
      "debug_stacks",
      [](const ProcMesh& procs, double timeout_s, bool file_lines) {
        debug::StackOptions options = options_of(timeout_s, file_lines);
        absl::StatusOr<std::vector<debug::ProcStacks>> dumps;
        {
          py::gil_scoped_release release;
          dumps = debug::stacks(procs, options);
        }
        if (!dumps.ok()) throw_status(dumps.status(), ErrorDomain::kProc);
        py::list out;
        for (const debug::ProcStacks& p : *dumps) out.append(to_dict(p));
        return out;
      },
      py::arg("procs"), py::arg("timeout"), py::arg("file_lines"),
      "Stack dumps of every proc of `procs` (castmesh::debug::stacks), as dicts.");
  module.def(
      "debug_this_process_stacks",
      [](double timeout_s, bool file_lines) {
        debug::StackOptions options = options_of(timeout_s, file_lines);
        debug::ProcStacks dump;
        {
          py::gil_scoped_release release;  // faulthandler's dump must not wait for this thread
          dump = debug::this_process_stacks(options);
        }
        return to_dict(dump);
      },
      py::arg("timeout"), py::arg("file_lines"), "This process's stack dump (all threads but the caller).");
  module.def("debug_stack_signal", &debug::stack_signal,
             "The real-time signal a dump sends every thread (castmesh::debug::stack_signal).");
  module.def(
      "debug_python_stack_hook",
      [] {
        absl::StatusOr<debug::PythonStackHook> hook = debug::python_stack_hook();
        if (!hook.ok()) throw_status(hook.status(), ErrorDomain::kProc);
        return py::make_tuple(hook->signal, hook->fd);
      },
      "(signal, fd) for faulthandler.register in this process.");
  module.def("debug_python_thread_starting", &debug::python_thread_starting, py::arg("delta"),
             "+1 when a Python thread is started, -1 once it runs Python code (no Python dump meanwhile).");
  module.def("debug_python_stack_hook_ready", [] { debug::python_stack_hook_ready(); },
             "Says faulthandler is registered for the hook: dumps include Python stacks from now on.");
}

}  // namespace castmesh::python
