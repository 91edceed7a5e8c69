// Python actors on the C++ core.
//
// Every Python actor is served by a PyActorServer: a C++ actor on a dedicated
// thread (its handlers take the GIL and run Python code, which may block).
// Its one message, PyCall, carries an endpoint name and the pickled
// arguments; its answer is the pickled outcome (a value or the remote
// exception's type, message and traceback), built by castmesh._actor_server.
// The controller spawns servers on worker procs through the ProcMesh
// (registered actor "castmesh.PyActorHost", the name kept on the wire;
// constructor argument: the pickled actor class and its arguments) and talks
// to them through ActorRefs, so every Python message travels over castmesh's
// transport like any C++ message.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "call_slot.h"
#include "castmesh/actor.h"
#include "castmesh/runtime.h"
#include "py_call.h"

namespace castmesh::python {

// The C++ actor serving one Python actor (see the file comment). Runs on its
// own thread; takes the GIL for on_start, each call and on_stop.
class PyActorServer : public Actor {
 public:
  // `spec`: what castmesh._actor_server.ActorServer is made from (class, arguments, place in the mesh).
  explicit PyActorServer(std::string spec) : spec_(std::move(spec)) {}
  ~PyActorServer() override;

  // Creates the Python actor (castmesh._actor_server.ActorServer); its failure fails this actor.
  void on_start() override;
  // Closes the Python actor (its __cleanup__).
  void on_stop() override;
  // Runs one endpoint call; the answer is the pickled outcome.
  std::string call(const PyCall& call);

  using Handlers = castmesh::Handlers<&PyActorServer::call>;

 private:
  // The Python actor failed (its constructor raised, an endpoint raised a
  // BaseException that is not an Exception, or it left a failure of a mesh
  // it owns unhandled): this actor fails with that reason, so its mesh and
  // monitors see a failed member. Called with the GIL held.
  void fail_if_python_failed();
  void release_server();
  // While a trace records: names this call's handler slice "Class.endpoint"
  // (interned once per endpoint). Called with the GIL held.
  void name_trace_slice(const std::string& endpoint);

  std::string spec_;
  pybind11::object server_;
  // Interned "Class.endpoint" by endpoint, and the Python class's name (read once): only while tracing.
  absl::flat_hash_map<std::string, uint32_t> trace_names_;
  std::optional<std::string> trace_class_;
};

// Spawns a server in `runtime`'s own proc on a dedicated thread (an `index`
// gives it a well-known address); its status as ProcError. Python thread.
ActorRef<PyActorServer> spawn_server_here(Runtime& runtime, const std::string& name, std::string spec,
                                          std::optional<uint64_t> index = std::nullopt);

// A ref to one PyActorServer, wherever it lives (castmesh._castmesh.ActorRef).
struct PyActorRef {
  ActorRef<PyActorServer> ref;

  // Sends a request; the slot gets the pickled outcome. Python thread.
  std::shared_ptr<CallFuture> ask(const std::string& endpoint, std::string payload) const {
    pybind11::gil_scoped_release release;
    return track(ref.ask(PyCall{endpoint, std::move(payload)}));
  }
  // Sends a one-way call (broadcast). Python thread.
  void tell(const std::string& endpoint, std::string payload) const {
    pybind11::gil_scoped_release release;
    ref.tell(PyCall{endpoint, std::move(payload), /*oneway=*/true});
  }
};

}  // namespace castmesh::python
