// castmesh._castmesh host agents and host meshes (docs/hosts.md): the agent
// loop run by castmesh.run_worker_loop_forever, and the controller's
// HostMesh behind castmesh.attach_to_workers. Every call that waits on the
// network releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/host_mesh.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

using Dims = std::vector<std::pair<std::string, size_t>>;
using Env = std::vector<std::pair<std::string, std::string>>;

// A host agent running on a thread of its own, so that the Python thread
// that waits for it still sees KeyboardInterrupt.
class PyHostAgent {
 public:
  explicit PyHostAgent(HostAgentOptions options) : state_(std::make_shared<State>()) {
    options.on_listening = [state = state_](const std::string& address) {
      detail::MutexLock lock(state->mu);
      state->address = address;
      state->cv.notify_all();
    };
    std::thread([state = state_, options = std::move(options)]() mutable {
      absl::Status status = run_host_agent(std::move(options));
      detail::MutexLock lock(state->mu);
      state->done = true;
      state->status = std::move(status);
      state->cv.notify_all();
    }).detach();  // a dedicated agent process: it ends with the process
  }

  // Waits until the agent listens (its address) or fails to start (raises).
  std::string address() {
    py::gil_scoped_release release;
    detail::MutexLock lock(state_->mu);
    state_->cv.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return !state_->address.empty() || state_->done;
    });
    if (state_->address.empty()) throw_status(state_->status, ErrorDomain::kProc);
    return state_->address;
  }

  // Waits up to `timeout_s` for the agent to end: True once a controller
  // shut it down; raises if it failed.
  bool wait(double timeout_s) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      detail::MutexLock lock(state_->mu);
      if (!state_->cv.wait_for(lock, absl::Seconds(timeout_s),
                               [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) { return state_->done; })) {
        return false;
      }
      status = state_->status;
    }
    if (!status.ok()) throw_status(status, ErrorDomain::kProc);
    return true;
  }

 private:
  struct State {
    detail::Mutex mu;
    detail::CondVar cv;
    std::string address ABSL_GUARDED_BY(mu);
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

Shape shape_of(const Dims& dims) { return value_or_throw(Shape::Create(dims), ErrorDomain::kValue); }

}  // namespace

void bind_hosts(py::module_& module) {
  module.def(
      "resolve_mesh_secret",
      [](const std::string& secret) { return value_or_throw(resolve_mesh_secret(secret), ErrorDomain::kProc); },
      py::arg("secret"),
      "The mesh secret: `secret`, else CASTMESH_SECRET, else the 0600 file CASTMESH_SECRET_FILE (raises).");
  py::class_<PyHostAgent>(module, "HostAgent", "A host agent serving on a thread of its own (run_host_agent).")
      .def(py::init([](const std::string& address, const std::string& secret, const std::string& host_identity,
                       std::vector<std::string> worker_argv, const std::string& ca, const std::string& cert,
                       const std::string& private_key) {
             HostAgentOptions options;
             options.address = address;
             options.secret = secret;
             options.host_identity = host_identity;
             options.worker_argv = std::move(worker_argv);
             options.ca = ca;
             options.cert = cert;
             options.private_key = private_key;
             return std::make_unique<PyHostAgent>(std::move(options));
           }),
           py::arg("address"), py::arg("secret"), py::arg("host_identity"), py::arg("worker_argv"), py::arg("ca"),
           py::arg("cert"), py::arg("private_key"))
      .def_property_readonly("address", &PyHostAgent::address, "The address it listens at (waits until it does).")
      .def("wait", &PyHostAgent::wait, py::arg("timeout"), "True once a controller shut it down.");

  py::class_<HostMesh>(module, "HostMesh", "Attached host agents (castmesh::HostMesh).")
      .def_static(
          "attach",
          [](const std::vector<std::string>& workers, const std::string& name, const std::string& secret,
             const std::string& ca, const std::string& cert, const std::string& private_key,
             double heartbeat_interval_s, double heartbeat_timeout_s, double attach_timeout_s) {
            Runtime* runtime = Runtime::current();
            if (runtime == nullptr) throw std::runtime_error("no castmesh runtime in this process");
            HostMeshOptions options;
            options.name = name;
            options.secret = secret;
            options.ca = ca;
            options.cert = cert;
            options.private_key = private_key;
            options.heartbeat_interval = absl::Seconds(heartbeat_interval_s);
            options.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);
            options.attach_timeout = absl::Seconds(attach_timeout_s);
            py::gil_scoped_release release;
            return value_or_throw(HostMesh::attach(*runtime, workers, std::move(options)), ErrorDomain::kProc);
          },
          py::arg("workers"), py::arg("name"), py::arg("secret"), py::arg("ca"), py::arg("cert"),
          py::arg("private_key"), py::arg("heartbeat_interval"), py::arg("heartbeat_timeout"),
          py::arg("attach_timeout"))
      .def_property_readonly("size", &HostMesh::size)
      .def_property_readonly("hosts",
                             [](const HostMesh& mesh) {
                               std::vector<py::dict> out;
                               for (const HostInfo& info : mesh.hosts()) {
                                 py::dict d;
                                 d["address"] = info.address;
                                 d["agent"] = info.agent;
                                 d["hostname"] = info.hostname;
                                 d["host_identity"] = info.host_identity;
                                 d["agent_pid"] = info.agent_pid;
                                 out.push_back(std::move(d));
                               }
                               return out;
                             })
      .def("select_index",
           [](const HostMesh& mesh, const std::string& name, int64_t index) {
             return value_or_throw(mesh.slice(name, Selector(index)), ErrorDomain::kValue);
           })
      .def("select_range",
           [](const HostMesh& mesh, const std::string& name, int64_t start, int64_t stop, int64_t step) {
             return value_or_throw(mesh.slice(name, Selector(Range(start, stop, step))), ErrorDomain::kValue);
           })
      .def(
          "spawn_procs",
          [](const HostMesh& mesh, const Dims& per_host, std::vector<std::string> argv, bool agent_python_worker,
             Env env, std::vector<Env> env_by_rank, const std::string& proc_bind, double join_timeout_s) {
            HostSpawnOptions options;
            options.worker_argv = std::move(argv);
            options.agent_python_worker = agent_python_worker;
            options.worker_env = std::move(env);
            if (!env_by_rank.empty()) {
              options.env_for = [env_by_rank = std::move(env_by_rank)](const Point& point) {
                return point.rank() < env_by_rank.size() ? env_by_rank[point.rank()] : Env{};
              };
            }
            options.proc_bind = proc_bind;
            options.join_timeout = absl::Seconds(join_timeout_s);
            Shape shape = shape_of(per_host);
            py::gil_scoped_release release;
            return value_or_throw(mesh.spawn_procs(shape, std::move(options)), ErrorDomain::kProc);
          },
          py::arg("per_host"), py::arg("argv"), py::arg("agent_python_worker"), py::arg("env"),
          py::arg("env_by_rank"), py::arg("proc_bind"), py::arg("join_timeout"))
      .def("shutdown", [](const HostMesh& mesh) {
        py::gil_scoped_release release;
        absl::Status status = mesh.shutdown();
        if (!status.ok()) throw_status(status, ErrorDomain::kProc);
      });
}

}  // namespace castmesh::python
