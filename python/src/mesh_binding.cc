// castmesh._castmesh.ProcMesh, ActorMesh and ReplyStream: the C++ ProcMesh
// and ActorMesh of Python actor servers (cast tree, supervision) for
// castmesh.mesh.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actor_server.h"
#include "bindings.h"
#include "call_slot.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/shape.h"
#include "py_reducers.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

// A castmesh::ActorMesh over the Python actor servers of a ProcMesh: cast and
// call travel along the mesh's cast tree, and a member whose proc dies fails
// pending and later calls naming its point.
struct ActorMeshHandle {
  ActorMesh<PyActorServer> mesh;

  std::vector<PyActorRef> refs() const {
    std::vector<PyActorRef> out;
    for (auto& r : mesh.refs()) out.push_back(PyActorRef{r});
    return out;
  }
  ActorMeshHandle select_index(const std::string& name, int64_t index) const {
    return ActorMeshHandle{value_or_throw(mesh.slice(name, Selector(index)), ErrorDomain::kValue)};
  }
  ActorMeshHandle select_range(const std::string& name, int64_t start, int64_t stop, int64_t step) const {
    // Python normalises its slices first (castmesh.shape.normalize_selector):
    // a negative value here is refused by the C++ Shape, never read as "to the end".
    return ActorMeshHandle{value_or_throw(mesh.slice(name, Selector(Range(start, stop, step))), ErrorDomain::kValue)};
  }
  void cast(const std::string& endpoint, std::string payload) const {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = mesh.cast(PyCall{endpoint, std::move(payload), /*oneway=*/true});
    }
    if (!status.ok()) throw_status(status, ErrorDomain::kProc);
  }
  std::shared_ptr<MeshCallFuture> call(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    return track(mesh.call(PyCall{endpoint, std::move(payload)}));
  }
  // A call whose replies are pieces (py_reducers.h) folded with the reducer
  // `op` on the way up the cast tree: one piece for the whole mesh.
  std::shared_ptr<CallFuture> call_reduce(const std::string& endpoint, std::string payload,
                                          const std::string& op) const {
    Reducer<std::string> reducer = value_or_throw(piece_reducer(op), ErrorDomain::kValue);
    py::gil_scoped_release release;
    return track(mesh.call(PyCall{endpoint, std::move(payload)}, std::move(reducer)));
  }
  // Through the cast tree like call(), so it stays ordered after casts. The
  // one member's reply completes the slot from the gather itself: no
  // continuation future (ActorMesh::call_one's then()) between them.
  std::shared_ptr<CallFuture> call_one(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    if (mesh.size() != 1) return track(mesh.call_one(PyCall{endpoint, std::move(payload)}));  // its error
    auto slot = std::make_shared<CallFuture>();
    mesh.call(PyCall{endpoint, std::move(payload)}).on_ready([slot](absl::StatusOr<ValueMesh<std::string>> replies) {
      if (!replies.ok()) {
        slot->complete(replies.status());
      } else {
        slot->complete(replies->values().front());
      }
    });
    return slot;
  }
};

// The replies of a mesh stream, in arrival order.
struct PyReplyStream {
  std::shared_ptr<ReplyStream<std::string>> stream;

  // ("ok", position, bytes) | ("failed", position, (code name, message)) for
  // a member whose reply failed (its proc died: the others' replies still
  // come) | ("timeout", -1, None) | ("end", -1, None); a failed stream raises
  // ProcError with its status code. Waits up to `timeout` s (< 0: no limit).
  py::tuple next(double timeout) {
    absl::StatusOr<std::pair<Point, absl::StatusOr<std::string>>> item = absl::UnknownError("");
    {
      py::gil_scoped_release release;
      item = stream->next(timeout < 0 ? absl::InfiniteDuration() : absl::Seconds(timeout));
    }
    if (!item.ok()) {
      if (item.status().code() == absl::StatusCode::kOutOfRange) return py::make_tuple("end", -1, py::none());
      if (item.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return py::make_tuple("timeout", -1, py::none());
      }
      throw_status(item.status(), ErrorDomain::kProc);
    }
    const auto position = static_cast<int64_t>(item->first.position());
    if (!item->second.ok()) {
      const absl::Status& failed = item->second.status();
      return py::make_tuple("failed", position,
                            py::make_tuple(absl::StatusCodeToString(failed.code()), std::string(failed.message())));
    }
    return py::make_tuple("ok", position, py::bytes(*item->second));
  }
};

ActorMeshHandle spawn_actor_mesh(const ProcMesh& procs, const std::string& name, std::string spec,
                             const std::vector<std::pair<std::string, size_t>>& dims) {
  absl::StatusOr<ActorMesh<PyActorServer>> mesh = absl::UnknownError("not spawned");
  {
    py::gil_scoped_release release;
    absl::StatusOr<Shape> shape = Shape::Create(dims);
    if (!shape.ok()) {
      mesh = shape.status();
    } else {
      MeshOptions options;
      options.name = name;
      // A dead proc fails the calls that include it (ProcError in Python);
      // the actors on the other procs keep running.
      options.on_failure = [](const MeshEvent&) { return MeshFailureAction::kContinue; };
      mesh = ActorMesh<PyActorServer>::Spawn(procs, *shape, std::move(options), spec);
    }
  }
  return ActorMeshHandle{value_or_throw(std::move(mesh), ErrorDomain::kProc)};
}

std::vector<PyActorRef> spawn_on_mesh(const ProcMesh& mesh, const std::string& name, std::string spec) {
  absl::StatusOr<std::vector<ActorRef<PyActorServer>>> refs;
  {
    py::gil_scoped_release release;
    refs = mesh.spawn<PyActorServer>(name, spec);
  }
  if (!refs.ok()) throw_status(refs.status(), ErrorDomain::kProc);
  std::vector<PyActorRef> out;
  out.reserve(refs->size());
  for (auto& r : *refs) out.push_back(PyActorRef{std::move(r)});
  return out;
}

}  // namespace

void bind_meshes(py::module_& module) {
  py::class_<PyReplyStream>(module, "ReplyStream", "Replies of a mesh stream, in arrival order.")
      .def("next", &PyReplyStream::next, py::arg("timeout") = -1.0);

  py::class_<ActorMeshHandle>(module, "ActorMeshHandle",
                          "castmesh::ActorMesh of Python actor servers (cast tree, supervision).")
      .def_property_readonly("size", [](const ActorMeshHandle& m) { return m.mesh.size(); })
      .def("refs", &ActorMeshHandle::refs)
      .def("select_index", &ActorMeshHandle::select_index, py::arg("name"), py::arg("index"))
      .def("select_range", &ActorMeshHandle::select_range, py::arg("name"), py::arg("start"), py::arg("stop"),
           py::arg("step"))
      .def("cast", &ActorMeshHandle::cast, py::arg("endpoint"), py::arg("payload"))
      .def("call", &ActorMeshHandle::call, py::arg("endpoint"), py::arg("payload"))
      .def("call_one", &ActorMeshHandle::call_one, py::arg("endpoint"), py::arg("payload"))
      .def("call_reduce", &ActorMeshHandle::call_reduce, py::arg("endpoint"), py::arg("payload"), py::arg("op"),
           "One reply piece folded by the C++ reducer op (sum, min, max) along the cast tree.")
      .def(
          "stream",
          [](const ActorMeshHandle& m, const std::string& endpoint, std::string payload) {
            py::gil_scoped_release release;
            return PyReplyStream{
                std::make_shared<ReplyStream<std::string>>(m.mesh.stream(PyCall{endpoint, std::move(payload)}))};
          },
          py::arg("endpoint"), py::arg("payload"))
      .def("stop", [](const ActorMeshHandle& m) {
        py::gil_scoped_release release;
        m.mesh.stop();
      });

  module.def("piece_folds", &piece_folds,
             "How many numeric folds of reply pieces this process has done (for tests).");

  py::class_<ProcMesh>(module, "ProcMesh", "Worker procs of a mesh (castmesh::ProcMesh).")
      .def_property_readonly("size", &ProcMesh::size)
      .def_property_readonly("pids",
                             [](const ProcMesh& m) {
                               std::vector<int64_t> pids;
                               for (const auto& p : m.procs()) pids.push_back(p.pid);
                               return pids;
                             })
      .def_property_readonly("ids",
                             [](const ProcMesh& m) {
                               std::vector<std::string> ids;
                               for (const auto& p : m.procs()) ids.push_back(p.id);
                               return ids;
                             })
      .def(
          "select_index",
          [](const ProcMesh& m, const std::string& name, int64_t index) {
            return value_or_throw(m.slice(name, Selector(index)), ErrorDomain::kValue);
          },
          py::arg("name"), py::arg("index"), "The procs at one index of a dimension (the dimension dropped).")
      .def(
          "select_range",
          [](const ProcMesh& m, const std::string& name, int64_t start, int64_t stop, int64_t step) {
            return value_or_throw(m.slice(name, Selector(Range(start, stop, step))), ErrorDomain::kValue);
          },
          py::arg("name"), py::arg("start"), py::arg("stop"), py::arg("step"),
          "The procs of a range of a dimension (indices normalised by castmesh.Shape).")
      .def("spawn", &spawn_on_mesh, py::arg("name"), py::arg("spec"),
           "Spawns one Python actor server per proc (index = rank).")
      .def("spawn_mesh", &spawn_actor_mesh, py::arg("name"), py::arg("spec"), py::arg("dims"),
           "Spawns one Python actor server per proc as a castmesh::ActorMesh of shape `dims`.")
      .def("stop", [](ProcMesh& m) {
        absl::Status status;
        {
          py::gil_scoped_release release;
          status = m.stop();
        }
        if (!status.ok()) throw_status(status, ErrorDomain::kProc);
      });
}

}  // namespace castmesh::python
