// CastRelay: the per-proc system forwarder of the cast trees of actor
// meshes whose members live in other procs (castmesh/detail/proc_cast.h,
// wire form in proto/castmesh/wire/v1/cast.proto).
//
// One relay per ProcHost: a proc service the mesh layer registers as
// kCastRelayService (core/proc/proc_service.h), so ProcHost::attach installs
// it with the other registered services; CastRelay::of finds it. It serves four
// control messages: CastMeshSetup (install a mesh's table; answered),
// CastMeshDrop, CastHop (deliver to this proc's members of the view,
// forward to the child procs) and CastReply (replies of a child's subtree).
// For each request passing through, it keeps one node that collects its
// own members' replies and its children's, and passes them up to its parent
// (at once for errors and streams, at the subtree's completion for values,
// folded into one for reductions with a registered reducer). A child proc
// that is lost fails every target of its subtree at once; a proc known to
// be lost is routed around (its children are adopted by its parent).
//
// Ordering: hops from one proc to another travel over that pair's one
// connection (FIFO), a relay handles hops in arrival order on its I/O
// thread, delivers to its members in that order and forwards in that
// order; the tree of a mesh is fixed (for one fan-out), so two casts from
// one sender thread reach every member in the order sent.
//
// Threading: thread-safe. Control handlers and peer-lost observers run on
// the host's I/O thread; launch() on caller threads; member replies arrive
// on actor threads. No lock is held while calling a CastPiecesHandler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "castmesh/cast_tree.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/detail/proc_cast.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "core/proc/proc_service.h"

namespace castmesh::wire::v1 {
class CastHop;
class CastReply;
}  // namespace castmesh::wire::v1

namespace castmesh::proc {
class ProcHost;
}

namespace google::protobuf {
class MessageLite;
}

namespace castmesh::mesh {

// The relay's name among the proc services (ProcHost::service).
inline constexpr char kCastRelayService[] = "cast_relay";

// What every relay of a mesh knows about it (the content of CastMeshSetup).
// Immutable once built.
struct CastTable {
  ProcId owner;       // the controller's proc id
  uint64_t id = 0;    // (owner, id) names the mesh
  std::string name;
  Shape base;
  std::vector<Address> members;                // by base rank
  std::vector<ProcId> group_procs;             // by group (tree node)
  std::vector<uint32_t> group_of_rank;         // by base rank
  std::vector<std::vector<size_t>> group_ranks;  // by group, increasing
  bool fold_in_tree = false;
  // The sender's first split when the groups' procs are on several hosts
  // (host = the host part of a TCP proc id) in runs of whole hosts: one span
  // per host, so a cast crosses the network once per host and each host's
  // first proc fans it out there (docs/hosts.md). Empty: the positional
  // split of cast_root_children.
  std::vector<CastSpan> host_spans;

  // The spans the sender sends to directly.
  std::vector<CastSpan> root_children(size_t fanout) const;

  // Builds the groups from the members' procs (in order of first
  // appearance), decides fold_in_tree and finds the host spans.
  static absl::StatusOr<CastTable> Build(ProcId owner, uint64_t id, std::string name, Shape base,
                                         std::vector<Address> members);
};

class CastRelay : public proc::ProcService, public std::enable_shared_from_this<CastRelay> {
 public:
  // Creates the relay of `host` (a proc of `runtime`) and registers its
  // control handlers and peer-lost observer with the host (the installer
  // of kCastRelayService).
  static std::shared_ptr<CastRelay> install(proc::ProcHost& host, Runtime& runtime);
  // The relay installed on `host`, or nullptr when none is (the mesh layer
  // registers it when the core library loads, so every attached host has one).
  static std::shared_ptr<CastRelay> of(const proc::ProcHost& host);
  // The host is going away: sends fail from now on, pending requests fail
  // (ProcHost's destructor calls it, before its endpoint stops).
  void detach() override;

  const ProcId& id() const { return id_; }

  // Caller side (ProcCastTree).
  uint64_t next_mesh_id() { return next_mesh_id_.fetch_add(1, std::memory_order_relaxed); }
  // Installs `table` here and in the relay of every other proc of its
  // groups (blocking requests; not on the I/O thread).
  absl::Status install_table(const std::shared_ptr<const CastTable>& table);
  // Forgets `table` here and in every other proc of its groups (one-way).
  void drop_table(const CastTable& table);
  absl::Status launch(const std::shared_ptr<const CastTable>& table, detail::CastRequest request,
                      detail::CastPiecesHandler on_pieces);

  // Statistics: CastHop messages this relay sent to other procs; CastReply
  // messages it received and the pieces (replies or folded runs) in them.
  uint64_t hops_sent() const { return hops_sent_.load(std::memory_order_relaxed); }
  uint64_t replies_received() const { return replies_received_.load(std::memory_order_relaxed); }
  uint64_t pieces_received() const { return pieces_received_.load(std::memory_order_relaxed); }

  struct Node;
  struct ChildPlan;  // where a request goes below a node (cast_relay.cc)
  // Replies (or errors) for slot `slot` of `node`: from own members' reply
  // ports, child relays and losses.
  void add_pieces(const std::shared_ptr<Node>& node, size_t slot, std::vector<detail::CastPiece> pieces);

 private:
  struct Parent;

  CastRelay(proc::ProcHost* host, Runtime* runtime, ProcId id) : host_(host), runtime_(runtime), id_(std::move(id)) {}

  void on_setup(const ProcId& peer, uint64_t correlation, const std::string& payload);
  void on_drop(const std::string& payload);
  void on_hop_message(const ProcId& peer, const std::string& payload);
  void on_reply_message(const std::string& payload);
  void on_peer_lost(const ProcId& peer, const absl::Status& why);

  // Handles one hop at this proc: node, forwarding, own deliveries.
  void handle_hop(const std::shared_ptr<const CastTable>& table, const wire::v1::CastHop& hop);
  void handle_reply(const wire::v1::CastReply& reply);
  // Forwards `hop` (a template: span and reply slot are set per child) to
  // the child `spans` of `node` (nullptr for tells); child i answers into
  // slot first_child_slot + i.
  void forward(const std::shared_ptr<const CastTable>& table, wire::v1::CastHop& hop,
               const std::vector<CastSpan>& spans, const std::shared_ptr<Node>& node, size_t first_child_slot);
  // Appends a slot per child span and per unreachable proc of `plan` to
  // `node` (after the slots it has), then opens and registers it.
  void open_node(const std::shared_ptr<Node>& node, const CastTable& table, const ChildPlan& plan);
  // Forwards `hop` to the plan's children (slots from first_child_slot on),
  // then fails the slots of its unreachable procs (after the children's).
  void send_to_children(const std::shared_ptr<const CastTable>& table, wire::v1::CastHop& hop,
                        const ChildPlan& plan, const std::shared_ptr<Node>& node, size_t first_child_slot);
  void fail_slot(const std::shared_ptr<Node>& node, size_t slot, const absl::Status& error);
  void send_up(const Node& node, std::vector<detail::CastPiece> pieces);
  absl::Status send_control(const ProcId& peer, const google::protobuf::MessageLite& message);
  void register_node(const std::shared_ptr<Node>& node);
  void forget_node(const Node& node);
  std::shared_ptr<const CastTable> find_table(const ProcId& owner, uint64_t id);
  bool is_lost(const ProcId& proc);
  // By group: lost according to `hop` or to this relay (peer-lost events).
  std::vector<bool> lost_groups(const CastTable& table, const wire::v1::CastHop& hop);
  static void set_lost_groups(const std::vector<bool>& lost, wire::v1::CastHop* hop);

  detail::SharedMutex host_mu_;
  proc::ProcHost* host_ ABSL_GUARDED_BY(host_mu_);  // nullptr once detached
  Runtime* const runtime_;
  const ProcId id_;
  std::atomic<uint64_t> next_mesh_id_{1};
  std::atomic<uint64_t> next_request_{1};
  std::atomic<uint64_t> hops_sent_{0};
  std::atomic<uint64_t> replies_received_{0};
  std::atomic<uint64_t> pieces_received_{0};

  detail::Mutex mu_;
  absl::flat_hash_map<std::pair<ProcId, uint64_t>, std::shared_ptr<const CastTable>> tables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::tuple<ProcId, uint64_t, uint64_t>, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<ProcId> lost_ ABSL_GUARDED_BY(mu_);
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace castmesh::mesh
