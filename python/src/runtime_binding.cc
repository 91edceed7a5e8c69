// castmesh._castmesh.Runtime (the controller's runtime, a proc from the
// start), spawning Python actors in this proc, and running a worker proc.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actor_server.h"
#include "bindings.h"
#include "castmesh/detail/embedding.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

Runtime& current_runtime() {
  Runtime* runtime = Runtime::current();
  if (runtime == nullptr) throw std::runtime_error("no castmesh runtime in this process");
  return *runtime;
}

namespace {

// Named sizes of a mesh, outermost first, as Python passes them.
using Dims = std::vector<std::pair<std::string, size_t>>;

// The runtime of a Python controller process (one per process, made by the
// castmesh package on first use).
class PyRuntime {
 public:
  // The runtime becomes a proc (transport endpoint, fresh mesh secret) at
  // once and stays one for the life of the process: every proc mesh it
  // allocates reuses that identity, and actors spawned here before or
  // between allocations (this_proc().spawn, the C++ ActorMesh's forwarders)
  // keep their addresses.
  //
  // With `listen` (a rendezvous controller, castmesh.Rendezvous) it listens
  // there with `secret` (empty: CASTMESH_SECRET) so that procs started by a
  // launcher can join; otherwise on a fresh abstract Unix address with a
  // fresh secret.
  // `tls`: (CA, certificate, key) files for mutual TLS on that listener
  // (attach_to_workers with TLS), or empty.
  explicit PyRuntime(int workers, const std::string& listen, const std::string& secret,
                     const std::string& advertise_host, const std::vector<std::string>& tls) {
    RuntimeOptions options;
    options.workers = workers;
    runtime_ = std::make_unique<Runtime>(std::move(options));
    if (!listen.empty()) {
      RendezvousAllocatorOptions rendezvous;
      rendezvous.listen = listen;
      rendezvous.secret = secret;
      rendezvous.advertise_host = advertise_host;
      if (tls.size() == 3) {
        rendezvous.tls_ca = tls[0];
        rendezvous.tls_cert = tls[1];
        rendezvous.tls_key = tls[2];
      } else if (!tls.empty()) {
        throw_status(absl::InvalidArgumentError("tls needs (ca, cert, key)"), ErrorDomain::kProc);
      }
      RendezvousAllocator allocator(std::move(rendezvous));
      absl::StatusOr<std::string> address = allocator.listen(*runtime_);
      if (!address.ok()) throw_status(address.status(), ErrorDomain::kProc);
      proc_ = detail::proc_identity(*runtime_);  // taken before the allocator lets go of it
      return;
    }
    proc_ = value_or_throw(detail::attach_proc(*runtime_), ErrorDomain::kProc);
  }
  // The runtime is shut down but deliberately never destroyed: proc meshes
  // and refs held by Python objects (freed in any order while the
  // interpreter exits) still point into it. One per process, so the leak is
  // bounded.
  ~PyRuntime() {
    shutdown();
    (void)runtime_.release();
  }

  // Starts worker procs shaped `dims` (the C++ ProcMesh has the Python
  // mesh's shape, so Python slices of it are C++ slices of the same view).
  ProcMesh allocate(const Dims& dims, std::vector<std::string> argv,
                    std::vector<std::pair<std::string, std::string>> env, double join_timeout_s) {
    LocalAllocatorOptions options;
    options.on_supervision_event = report_to_python_supervision;
    options.worker_argv = std::move(argv);
    options.worker_env = std::move(env);
    options.join_timeout = absl::Seconds(join_timeout_s);
    return allocate_with(LocalAllocator(std::move(options)), dims);
  }

  // Waits for the procs of `dims`, started by a launcher, to join this
  // runtime's address (RendezvousAllocator; rank r at row-major position r).
  ProcMesh allocate_rendezvous(const Dims& dims, double join_timeout_s) {
    RendezvousAllocatorOptions options;
    options.on_supervision_event = report_to_python_supervision;
    options.secret = proc_ ? proc_->secret : std::string();
    options.join_timeout = absl::Seconds(join_timeout_s);
    return allocate_with(RendezvousAllocator(std::move(options)), dims);
  }

  // This controller's proc id: its address.
  std::string address() const { return proc_ ? proc_->id : std::string(); }
  // Whether the procs of this controller prove `secret` (a later Rendezvous
  // that names another secret cannot reuse this address).
  bool has_secret(const std::string& secret) const { return proc_ && proc_->secret == secret; }

  void shutdown() {
    if (!runtime_) return;
    proc_.reset();
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      runtime_->shutdown();
    } else {
      runtime_->shutdown();
    }
  }

  Runtime& runtime() { return *runtime_; }

 private:
  // A failure of an actor these procs host whose spawner is this process:
  // castmesh.supervision watches every mesh Python spawns and reports each
  // failure once (MeshFailure, __supervise__, unhandled_fault_hook), so the
  // allocator's default (an error log line per member) would only repeat it.
  static void report_to_python_supervision(const SupervisionEvent& event) { (void)event; }

  // Runs the allocation (which waits for procs to join) without the GIL;
  // a failure becomes the Python exception of its status.
  template <typename Allocator>
  ProcMesh allocate_with(Allocator allocator, const Dims& dims) {
    absl::StatusOr<ProcMesh> mesh;
    {
      py::gil_scoped_release release;
      absl::StatusOr<Shape> shape = Shape::Create(dims);
      mesh = shape.ok() ? allocator.allocate(*runtime_, *shape) : absl::StatusOr<ProcMesh>(shape.status());
    }
    return value_or_throw(std::move(mesh), ErrorDomain::kProc);
  }

  std::unique_ptr<Runtime> runtime_;
  std::optional<detail::ProcIdentity> proc_;  // keeps the runtime a proc until shutdown
};

}  // namespace

void bind_runtime(py::module_& module) {
  py::class_<PyRuntime>(module, "Runtime", "The controller's castmesh::Runtime.")
      .def(py::init<int, const std::string&, const std::string&, const std::string&, const std::vector<std::string>&>(),
           py::arg("workers") = 0, py::arg("listen") = "", py::arg("secret") = "", py::arg("advertise_host") = "",
           py::arg("tls") = std::vector<std::string>{})
      .def("allocate", &PyRuntime::allocate, py::arg("dims"), py::arg("argv"), py::arg("env"),
           py::arg("join_timeout") = 60.0, "Starts worker procs with the LocalAllocator.")
      .def("allocate_rendezvous", &PyRuntime::allocate_rendezvous, py::arg("dims"), py::arg("join_timeout") = 60.0,
           "Waits for procs started by a launcher to join (RendezvousAllocator).")
      .def_property_readonly("address", &PyRuntime::address, "This controller's address (its proc id).")
      .def("has_secret", &PyRuntime::has_secret, py::arg("secret"), "Whether the mesh secret is `secret`.")
      .def(
          "spawn_local",
          [](PyRuntime& rt, const std::string& name, std::string spec, std::optional<uint64_t> index) {
            return PyActorRef{spawn_server_here(rt.runtime(), name, std::move(spec), index)};
          },
          py::arg("name"), py::arg("spec"), py::arg("index") = py::none(),
          "Spawns a Python actor in the controller (a fixed `index` gives it a well-known address).")
      .def("shutdown", &PyRuntime::shutdown);

  module.def(
      "spawn_in_this_proc",
      [](const std::string& name, std::string spec) {
        return PyActorRef{spawn_server_here(current_runtime(), name, std::move(spec))};
      },
      py::arg("name"), py::arg("spec"), "Spawns a Python actor in the proc running the caller (workers).");

  module.def(
      "erase_from_environment",
      [](const std::string& name) { detail::erase_from_environment(name.c_str()); },
      py::arg("name"),
      "Blanks the variable's value in place (the block ps and /proc/<pid>/environ show) and unsets it; for the "
      "worker's secret, main thread, before other threads read the environment.");
  module.def(
      "run_worker",
      [](std::vector<std::string> args) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        py::gil_scoped_release release;
        // Serves as a worker proc and exits the process when the controller
        // stops it (returns at once when not started by an allocator).
        castmesh::init(static_cast<int>(args.size()), argv.data());
      },
      py::arg("argv"), "Runs this process as a castmesh worker proc (never returns in a worker).");
}

}  // namespace castmesh::python
