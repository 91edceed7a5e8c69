// PyActorServer (actor_server.h), its registration for spawning by name, and
// castmesh._castmesh.ActorRef.
#include "actor_server.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/trace.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

PyActorServer::~PyActorServer() { release_server(); }

void PyActorServer::on_start() {
  if (!python_usable()) return;
  py::gil_scoped_acquire gil;
  try {
    py::object server_class = py::module_::import("castmesh._actor_server").attr("ActorServer");
    server_ = server_class(py::bytes(spec_), address().to_string(), address().index);
  } catch (py::error_already_set& error) {
    // castmesh._actor_server reports constructor errors as the server's failure
    // (below); this is a broken installation (module missing).
    fail(absl::InternalError(std::string("cannot create the Python actor server: ") + error.what()));
  }
  spec_.clear();
  fail_if_python_failed();
}

void PyActorServer::on_stop() { release_server(); }

std::string PyActorServer::call(const PyCall& call) {
  if (!python_usable()) return {};
  py::gil_scoped_acquire gil;
  if (!server_) return {};
  if (trace::recording()) name_trace_slice(call.endpoint);
  py::object reply = server_.attr("handle")(
      call.endpoint, py::memoryview::from_memory(call.payload.data(), call.payload.size()), call.oneway);
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(reply.ptr(), &data, &size) != 0) throw py::error_already_set();
  std::string out(data, static_cast<size_t>(size));
  fail_if_python_failed();
  return out;
}

void PyActorServer::name_trace_slice(const std::string& endpoint) {
  auto it = trace_names_.find(endpoint);
  if (it == trace_names_.end()) {
    if (!trace_class_) trace_class_ = py::str(server_.attr("trace_class")).cast<std::string>();
    // An Accumulator's call ("castmesh.reduce:<op>:<endpoint>") runs its
    // endpoint; castmesh's own ("castmesh.__init__": the constructor) read as methods.
    absl::string_view name = endpoint;
    if (absl::StartsWith(name, "castmesh.reduce:")) {
      name = name.substr(name.rfind(':') + 1);
    } else {
      absl::ConsumePrefix(&name, "castmesh.");
    }
    it = trace_names_.emplace(endpoint, trace::name_id(absl::StrCat(*trace_class_, ".", name))).first;
  }
  trace::name_current_handler(it->second);
}

void PyActorServer::fail_if_python_failed() {
  if (!server_) return;
  py::object failure = server_.attr("failure");
  if (!failure.is_none()) fail(absl::AbortedError(py::str(failure).cast<std::string>()));
}

void PyActorServer::release_server() {
  if (!server_ || !python_usable()) {
    // Interpreter gone: leak the reference rather than touch Python.
    if (server_) server_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    server_.attr("close")();
  } catch (py::error_already_set&) {
  }
  server_ = py::object();
}

ActorRef<PyActorServer> spawn_server_here(Runtime& runtime, const std::string& name, std::string spec,
                                          std::optional<uint64_t> index) {
  SpawnOptions options;
  options.name = name;
  options.index = index;
  options.dedicated_thread = true;
  return value_or_throw(runtime.spawn_with<PyActorServer>(std::move(options), std::move(spec)), ErrorDomain::kProc);
}

namespace {

// The name other procs spawn it by: part of the wire (spawn requests), so it
// keeps the spelling it had before the class was renamed (docs/architecture.md, "Names").
constexpr char kServerActorName[] = "castmesh.PyActorHost";

// Registered by hand (not CASTMESH_REGISTER_ACTOR) so that servers spawned by
// other procs get a dedicated thread.
const bool g_server_registered [[maybe_unused]] = [] {
  detail::ActorFactory factory;
  factory.name = kServerActorName;
  factory.arg_types = {std::string(type_name<std::string>())};
  factory.spawn = [](Runtime& runtime, SpawnOptions options,
                     const std::vector<std::string>& args) -> absl::StatusOr<Address> {
    if (args.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(kServerActorName, " takes one argument (the spec)"));
    }
    std::string spec;
    if (absl::Status st = detail::decode_value(args[0], &spec); !st.ok()) return st;
    options.dedicated_thread = true;
    auto ref = runtime.spawn_with<PyActorServer>(std::move(options), std::move(spec));
    if (!ref.ok()) return ref.status();
    return ref->address();
  };
  detail::register_actor_factory(type_id<PyActorServer>(), std::move(factory));
  return true;
}();

PyActorRef ref_from_address(const std::string& text) {
  return PyActorRef{ActorRef<PyActorServer>::from_address(value_or_throw(Address::parse(text), ErrorDomain::kValue))};
}

}  // namespace

void bind_actor_server(py::module_& module) {
  py::class_<PyActorRef>(module, "ActorRef", "Address of one Python actor server (castmesh.PyActorServer).")
      .def_static("from_address", &ref_from_address, py::arg("address"))
      .def_property_readonly("address", [](const PyActorRef& r) { return r.ref.address().to_string(); })
      .def_property_readonly("proc", [](const PyActorRef& r) { return r.ref.address().proc; })
      .def("ask", &PyActorRef::ask, py::arg("endpoint"), py::arg("payload"))
      .def("tell", &PyActorRef::tell, py::arg("endpoint"), py::arg("payload"))
      .def("stop", [](const PyActorRef& r) { r.ref.stop(); })
      .def("__repr__", [](const PyActorRef& r) { return "ActorRef(" + r.ref.address().to_string() + ")"; });
}

}  // namespace castmesh::python
