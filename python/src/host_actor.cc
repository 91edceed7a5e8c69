// PyActorHost (host_actor.h), its registration for spawning by name, and
// castmesh._castmesh.ActorRef.
#include "host_actor.h"

#include <vector>

#include "bindings.h"
#include "castmesh/proc_mesh.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

PyActorHost::~PyActorHost() { release_host(); }

void PyActorHost::on_start() {
  if (!python_usable()) return;
  py::gil_scoped_acquire gil;
  try {
    py::object host_class = py::module_::import("castmesh._host").attr("ActorHost");
    host_ = host_class(py::bytes(spec_), address().to_string(), address().index);
  } catch (py::error_already_set& error) {
    // castmesh._host reports constructor errors as the host's failure
    // (below); this is a broken installation (module missing).
    fail(absl::InternalError(std::string("cannot create the Python actor host: ") + error.what()));
  }
  spec_.clear();
  fail_if_python_failed();
}

void PyActorHost::on_stop() { release_host(); }

std::string PyActorHost::call(const PyCall& call) {
  if (!python_usable()) return {};
  py::gil_scoped_acquire gil;
  if (!host_) return {};
  py::object reply = host_.attr("handle")(
      call.endpoint, py::memoryview::from_memory(call.payload.data(), call.payload.size()), call.oneway);
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(reply.ptr(), &data, &size) != 0) throw py::error_already_set();
  std::string out(data, static_cast<size_t>(size));
  fail_if_python_failed();
  return out;
}

void PyActorHost::fail_if_python_failed() {
  if (!host_) return;
  py::object failure = host_.attr("failure");
  if (!failure.is_none()) fail(absl::AbortedError(py::str(failure).cast<std::string>()));
}

void PyActorHost::release_host() {
  if (!host_ || !python_usable()) {
    // Interpreter gone: leak the reference rather than touch Python.
    if (host_) host_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    host_.attr("close")();
  } catch (py::error_already_set&) {
  }
  host_ = py::object();
}

ActorRef<PyActorHost> spawn_host_here(Runtime& runtime, const std::string& name, std::string spec,
                                      std::optional<uint64_t> index) {
  SpawnOptions options;
  options.name = name;
  options.index = index;
  options.dedicated_thread = true;
  return value_or_throw(runtime.spawn_with<PyActorHost>(std::move(options), std::move(spec)), ErrorDomain::kProc);
}

namespace {

constexpr char kHostActorName[] = "castmesh.PyActorHost";

// Registered by hand (not CASTMESH_REGISTER_ACTOR) so that hosts spawned by
// other procs get a dedicated thread.
const bool g_host_registered [[maybe_unused]] = [] {
  detail::ActorFactory factory;
  factory.name = kHostActorName;
  factory.arg_types = {std::string(type_name<std::string>())};
  factory.spawn = [](Runtime& runtime, SpawnOptions options,
                     const std::vector<std::string>& args) -> absl::StatusOr<Address> {
    if (args.size() != 1) return absl::InvalidArgumentError("castmesh.PyActorHost takes one argument (the spec)");
    std::string spec;
    if (absl::Status st = detail::decode_value(args[0], &spec); !st.ok()) return st;
    options.dedicated_thread = true;
    auto ref = runtime.spawn_with<PyActorHost>(std::move(options), std::move(spec));
    if (!ref.ok()) return ref.status();
    return ref->address();
  };
  detail::register_actor_factory(type_id<PyActorHost>(), std::move(factory));
  return true;
}();

PyActorRef ref_from_address(const std::string& text) {
  return PyActorRef{ActorRef<PyActorHost>::from_address(value_or_throw(Address::parse(text), ErrorDomain::kValue))};
}

}  // namespace

void bind_host_actor(py::module_& module) {
  py::class_<PyActorRef>(module, "ActorRef", "Address of one Python actor host (castmesh.PyActorHost).")
      .def_static("from_address", &ref_from_address, py::arg("address"))
      .def_property_readonly("address", [](const PyActorRef& r) { return r.ref.address().to_string(); })
      .def_property_readonly("proc", [](const PyActorRef& r) { return r.ref.address().proc; })
      .def("ask", &PyActorRef::ask, py::arg("endpoint"), py::arg("payload"))
      .def("tell", &PyActorRef::tell, py::arg("endpoint"), py::arg("payload"))
      .def("stop", [](const PyActorRef& r) { r.ref.stop(); })
      .def("__repr__", [](const PyActorRef& r) { return "ActorRef(" + r.ref.address().to_string() + ")"; });
}

}  // namespace castmesh::python
