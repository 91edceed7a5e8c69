// The two mesh routers (castmesh/detail/mesh_router.h): forwarding actors in
// process, the procs' cast relays across procs.
#include "castmesh/detail/mesh_router.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mesh_state.h"
#include "core/mesh/mesh_directory.h"

namespace castmesh::detail {

// ---- MeshCall: what a call of a kind does not use ----

std::shared_ptr<void> MeshCall::open_node(size_t, const std::shared_ptr<void>&, size_t) const { return nullptr; }
CastPiecesHandler MeshCall::on_pieces() const { return nullptr; }
void MeshCall::fail(absl::Status) const {}
Point MeshCall::base_point(size_t rank) const { return *mesh_->base().point_at(rank); }

absl::StatusOr<std::unique_ptr<MeshRouter>> make_mesh_router(Runtime& runtime, const std::string& name,
                                                             const Shape& base, const std::vector<Address>& members) {
  const bool remote = std::any_of(members.begin(), members.end(),
                                  [&](const Address& m) { return m.proc != runtime.proc_id(); });
  return remote ? ProcRouter::Create(runtime, name, base, members)
                : InProcessRouter::Create(runtime, name, base, members);
}

// ---- InProcessRouter ----

void MeshForwarder::hop(const MeshHop& h) { h.router->run(h); }

absl::StatusOr<std::unique_ptr<MeshRouter>> InProcessRouter::Create(Runtime& runtime, const std::string& name,
                                                                    const Shape& base,
                                                                    const std::vector<Address>& members) {
  std::unique_ptr<InProcessRouter> router(new InProcessRouter());
  for (size_t rank = 0; rank < base.size(); ++rank) {
    absl::StatusOr<ActorRef<MeshForwarder>> forwarder =
        runtime.spawn_with<MeshForwarder>(SpawnOptions{.name = name + "-cast", .index = rank});
    if (!forwarder.ok()) {
      router->stop();
      return forwarder.status();
    }
    router->forwarders_.push_back(*forwarder);
  }
  // Across procs the relays list the mesh (CastMeshSetup); here, its router.
  static std::atomic<uint64_t> next_local_mesh{1};
  auto membership = std::make_shared<mesh::MeshMembership>();
  membership->key = absl::StrCat("inproc#", next_local_mesh.fetch_add(1, std::memory_order_relaxed));
  membership->name = name;
  membership->base = base;
  membership->members = members;
  router->directory_key_ = membership->key;
  mesh::MeshDirectory::add(std::move(membership));
  return std::unique_ptr<MeshRouter>(std::move(router));
}

InProcessRouter::~InProcessRouter() {
  if (!directory_key_.empty()) mesh::MeshDirectory::remove(directory_key_);
}

void InProcessRouter::stop() {
  for (const auto& f : forwarders_) f.stop();
}

absl::Status InProcessRouter::launch(const Shape& view, size_t fanout, const std::shared_ptr<MeshCall>& call,
                                     bool fold) {
  absl::StatusOr<CastRoute> route = CastRoute::Create(forwarders_.size(), view.slice(), fanout);
  if (!route.ok()) return route.status();
  call->route = *std::move(route);
  const std::vector<CastSpan> spans = call->route.root_children();
  // A reduction's root node (the caller's) has a slot per child of the root.
  std::shared_ptr<void> root = fold ? call->open_node(spans.size(), nullptr, 0) : nullptr;
  forward(call, spans, root, 0);
  return absl::OkStatus();
}

void InProcessRouter::forward(const std::shared_ptr<const MeshCall>& call, const std::vector<CastSpan>& spans,
                              const std::shared_ptr<void>& up, size_t first_slot) const {
  size_t slot = first_slot;
  for (const CastSpan& child : spans) forwarders_[child.begin].tell(MeshHop{this, call, child, up, slot++});
}

void InProcessRouter::run(const MeshHop& hop) const {
  const MeshCall& call = *hop.call;
  const bool own = call.route.delivers(hop.span);
  const std::vector<CastSpan> children = call.route.children(hop.span);
  // Reductions: this hop's node folds its own member (slot 0) and its
  // children (the slots after); null for other calls.
  std::shared_ptr<void> node = hop.up ? call.open_node((own ? 1 : 0) + children.size(), hop.up, hop.up_slot) : nullptr;
  forward(hop.call, children, node, own ? 1 : 0);
  if (own) call.deliver(hop.span.begin, node);
}

absl::Status InProcessRouter::tell(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> cast) {
  return launch(view, fanout, cast, /*fold=*/false);
}

void InProcessRouter::gather(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  if (absl::Status st = launch(view, fanout, call, /*fold=*/false); !st.ok()) call->fail(st);
}

void InProcessRouter::stream(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  gather(view, fanout, std::move(call));  // the call decides how replies are passed on
}

void InProcessRouter::reduce(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  if (absl::Status st = launch(view, fanout, call, /*fold=*/true); !st.ok()) call->fail(st);
}

// ---- ProcRouter ----

absl::StatusOr<std::unique_ptr<MeshRouter>> ProcRouter::Create(Runtime& runtime, const std::string& name,
                                                               const Shape& base, const std::vector<Address>& members) {
  absl::StatusOr<std::shared_ptr<ProcCastTree>> tree = ProcCastTree::Create(runtime, name, base, members);
  if (!tree.ok()) return tree.status();
  return std::unique_ptr<MeshRouter>(new ProcRouter(*std::move(tree)));
}

absl::Status ProcRouter::send(CastMode mode, const Shape& view, size_t fanout, const MeshCall& call,
                              CastPiecesHandler on_pieces) const {
  CastRequest request;
  request.mode = mode;
  request.view = view.slice();
  request.fanout = fanout;
  if (absl::Status encoded = call.encode(&request); !encoded.ok()) return encoded;
  return tree_->send(std::move(request), std::move(on_pieces));
}

absl::Status ProcRouter::tell(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> cast) {
  return send(CastMode::kTell, view, fanout, *cast, nullptr);
}

void ProcRouter::gather(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  if (absl::Status st = send(CastMode::kGather, view, fanout, *call, call->on_pieces()); !st.ok()) call->fail(st);
}

void ProcRouter::stream(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  if (absl::Status st = send(CastMode::kStream, view, fanout, *call, call->on_pieces()); !st.ok()) call->fail(st);
}

void ProcRouter::reduce(const Shape& view, size_t fanout, std::shared_ptr<MeshCall> call) {
  CastPiecesHandler fold = call->on_pieces();
  if (absl::Status st = send(CastMode::kReduce, view, fanout, *call, fold); !st.ok()) {
    // Reported as the failure of the first target, like any failed piece.
    fold({CastPiece{view.slice().rank_at(0).value_or(0), 1, st, {}}});
  }
}

}  // namespace castmesh::detail
