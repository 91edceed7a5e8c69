// Internal: how the casts and requests of an actor mesh reach its members.
// Used by ActorMesh; public only because ActorMesh is a template.
//
// A mesh gets one MeshRouter when it is created (make_mesh_router), for its
// whole life:
//   InProcessRouter  every member lives in this process: a forwarding actor
//                    per member ("<name>-cast"[rank]) relays each cast along
//                    the cast tree of the base mesh (castmesh/cast_tree.h),
//                    delivering typed messages; reductions fold at every node.
//   ProcRouter       some members live in other procs: the tree's nodes are
//                    the procs' cast relays (detail/proc_cast.h); the message
//                    is encoded once and the replies come back as CastPieces.
// ActorMesh describes each cast or request as a MeshCall (its typed parts:
// the message, the reply type, where the replies go; detail/mesh_calls.h);
// the router decides where it travels and calls back into it.
//
// Threading: routers are thread-safe; their methods are called on the
// caller's thread, MeshCall's callbacks on forwarding actors, relay I/O
// threads and whichever thread completes a member's request.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/actor.h"
#include "castmesh/address.h"
#include "castmesh/cast_tree.h"
#include "castmesh/detail/proc_cast.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"

namespace castmesh::detail {

class MeshState;

// One cast or request of a mesh, made by ActorMesh per call: the typed
// parts the routers call back into. Immutable once handed to a router,
// except `route`, which InProcessRouter sets before the first hop.
class MeshCall {
 public:
  explicit MeshCall(std::shared_ptr<MeshState> mesh) : mesh_(std::move(mesh)) {}
  virtual ~MeshCall() = default;
  MeshCall(const MeshCall&) = delete;
  MeshCall& operator=(const MeshCall&) = delete;

  // In process, on the member's forwarding actor: sends the message to the
  // member at base rank `rank`; its reply (requests) goes to the call's
  // collection, or to slot 0 of `node` (reductions).
  virtual void deliver(size_t rank, const std::shared_ptr<void>& node) const = 0;
  // In process, reductions: the node folding a subtree of `slots` slots
  // that hands its result to slot `parent_slot` of `parent` (the root, with
  // a null parent, completes the call). Others: nullptr.
  virtual std::shared_ptr<void> open_node(size_t slots, const std::shared_ptr<void>& parent,
                                          size_t parent_slot) const;
  // Across procs: encodes the message (and a reduction's registered
  // reducer) once into `request`.
  virtual absl::Status encode(CastRequest* request) const = 0;
  // Across procs: where the replies' pieces go (called once, before the
  // request is sent; nullptr for a cast).
  virtual CastPiecesHandler on_pieces() const;
  // Nothing was sent: the request fails with `error` (casts: unused).
  virtual void fail(absl::Status error) const;

  MeshState& mesh() const { return *mesh_; }
  // The mesh's base point of base rank `rank` (what errors name).
  Point base_point(size_t rank) const;

  CastRoute route;  // in process: the route of this call (set by InProcessRouter)

 private:
  const std::shared_ptr<MeshState> mesh_;
};

// How the casts and requests of one mesh reach its members (see above).
// Every method takes the targeted view of the mesh's base shape and the
// cast tree's fan-out.
class MeshRouter {
 public:
  virtual ~MeshRouter() = default;
  // Sends `cast` to every live member of `view` (fire and forget). Errors:
  // nothing could be sent (no route, no codec, transport shut down).
  virtual absl::Status tell(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> cast) = 0;
  // Asks every member of `view`; each reply or error reaches `call`.
  virtual void gather(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) = 0;
  // Same, each reply passed on as soon as it arrives.
  virtual void stream(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) = 0;
  // Asks every member of `view`; the replies are folded on the way up.
  virtual void reduce(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) = 0;
  // The mesh stopped: stops what the router runs.
  virtual void stop() = 0;
};

// The router for members at `members` (by base rank of `base`): a
// ProcRouter when any of them lives in another proc than `runtime`, else
// an InProcessRouter. Errors: as the chosen router's Create.
absl::StatusOr<std::unique_ptr<MeshRouter>> make_mesh_router(Runtime& runtime, const std::string& name,
                                                             const Shape& base, const std::vector<Address>& members);

class InProcessRouter;

// The message between forwarding actors: which call, which span of the
// base mesh this hop is responsible for, and (for reductions) where the
// subtree's result goes.
struct MeshHop {
  const InProcessRouter* router = nullptr;  // alive: `call` holds the mesh that owns it
  std::shared_ptr<const MeshCall> call;
  CastSpan span;
  std::shared_ptr<void> up;  // the parent's node (reductions only)
  size_t up_slot = 0;
};

// The forwarding actor of one member of an in-process mesh.
class MeshForwarder : public Actor {
 public:
  // Runs one hop of a cast here (InProcessRouter::run).
  void hop(const MeshHop& h);
  using Handlers = castmesh::Handlers<&MeshForwarder::hop>;
};

// Every member in this process: casts travel between forwarding actors.
class InProcessRouter final : public MeshRouter {
 public:
  // Spawns a forwarding actor per member in `runtime` (name + "-cast",
  // index = base rank) and lists the mesh in MeshDirectory (so members find
  // it). Errors: a spawn failed (e.g. the names are taken; the forwarders
  // spawned so far are stopped).
  static absl::StatusOr<std::unique_ptr<MeshRouter>> Create(Runtime& runtime, const std::string& name,
                                                            const Shape& base, const std::vector<Address>& members);
  ~InProcessRouter() override;

  absl::Status tell(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> cast) override;
  void gather(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void stream(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void reduce(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void stop() override;

  // One hop, on the forwarding actor of hop.span.begin: forwards to the
  // hop's children first (so they start early), then delivers.
  void run(const MeshHop& hop) const;

 private:
  InProcessRouter() = default;
  // Routes `call` over `view` and sends it to the root's children (`fold`:
  // into the slots of a root node, for reductions). Errors: no route.
  absl::Status launch(const Shape& view, size_t fanout, const std::shared_ptr<MeshCall>& call, bool fold);
  // Sends `call` to the forwarders of `spans`, slots first_slot, +1, ...
  void forward(const std::shared_ptr<const MeshCall>& call, const std::vector<CastSpan>& spans,
               const std::shared_ptr<void>& up, size_t first_slot) const;

  std::vector<ActorRef<MeshForwarder>> forwarders_;  // by base rank; fixed once created
  std::string directory_key_;
};

// Members in other procs: casts travel between the procs' cast relays.
class ProcRouter final : public MeshRouter {
 public:
  // Installs the mesh in the relay of every proc holding a member (blocks
  // for their answers; ProcCastTree::Create). Errors: `runtime` is not a
  // proc, a proc did not answer.
  static absl::StatusOr<std::unique_ptr<MeshRouter>> Create(Runtime& runtime, const std::string& name,
                                                            const Shape& base, const std::vector<Address>& members);

  absl::Status tell(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> cast) override;
  void gather(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void stream(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void reduce(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) override;
  void stop() override {}

 private:
  explicit ProcRouter(std::shared_ptr<ProcCastTree> tree) : tree_(std::move(tree)) {}
  // Encodes `call` into a request of `mode` over `view` and sends it, its
  // replies to `on_pieces`. Errors: no codec, transport shut down.
  absl::Status send(CastMode mode, const Shape& view, size_t fanout, const MeshCall& call,
                    CastPiecesHandler on_pieces) const;

  std::shared_ptr<ProcCastTree> tree_;
};

}  // namespace castmesh::detail
