#include "core/mesh/cast_relay.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/detail/runtime_transport.h"
#include "castmesh/detail/slot_collector.h"
#include "castmesh/message.h"
#include "castmesh/value_mesh.h"
#include "castmesh/wire/v1/cast.pb.h"
#include "core/actor/runtime_core.h"
#include "core/log/log.h"
#include "core/mesh/mesh_directory.h"
#include "core/proc/proc_host.h"
#include "core/transport/address.h"
#include "core/wire/status_code.h"

namespace castmesh::mesh {
namespace {

namespace v1 = wire::v1;
using detail::CastMode;
using detail::CastPiece;

// The node key of the root (the caller's own collection point).
constexpr uint64_t kRootSpan = std::numeric_limits<uint64_t>::max();

v1::CastHop::Mode wire_mode(CastMode mode) {
  switch (mode) {
    case CastMode::kTell: return v1::CastHop::MODE_TELL;
    case CastMode::kGather: return v1::CastHop::MODE_GATHER;
    case CastMode::kStream: return v1::CastHop::MODE_STREAM;
    case CastMode::kReduce: return v1::CastHop::MODE_REDUCE;
  }
  return v1::CastHop::MODE_TELL;
}

CastMode mode_of(v1::CastHop::Mode mode) {
  switch (mode) {
    case v1::CastHop::MODE_GATHER: return CastMode::kGather;
    case v1::CastHop::MODE_STREAM: return CastMode::kStream;
    case v1::CastHop::MODE_REDUCE: return CastMode::kReduce;
    default: return CastMode::kTell;
  }
}

}  // namespace

// Where a node's replies go: the node (span) of the relay of `proc`, slot
// `slot`; or, for the root, the caller's handler.
struct CastRelay::Parent {
  ProcId proc;  // empty: `handler`
  uint64_t span = 0;
  uint32_t slot = 0;
  detail::CastPiecesHandler handler;
};

// One request passing through this relay: a slot per own target member and
// per child subtree (in rank order when the mesh folds in the tree). Its
// targets are counted in by one SlotCollector (a slot per target, slot by
// slot, each slot's targets in rank order): it finishes once every target
// has answered. Errors do not finish it: each target is passed up exactly
// once, value or error.
struct CastRelay::Node {
  struct Slot {
    ProcId proc;                // the child's proc, or this proc for an own member
    std::vector<size_t> ranks;  // its targets, increasing
    size_t first_target = 0;    // the collector slot of ranks[0] (set by open_node)
  };

  ProcId owner;
  uint64_t request = 0;
  uint64_t span = 0;  // the key: span_begin of this node, kRootSpan for the root
  CastMode mode = CastMode::kTell;
  Parent parent;
  const detail::EncodedFold* fold = nullptr;  // kReduce with a registered reducer
  bool pass_through = false;                  // the root: every batch goes to the handler at once

  std::vector<Slot> slots;  // fixed once the node is registered
  // Every piece answered, by target. Pieces passed up at once (errors, and
  // every piece of a stream or of the root) are kept without their value;
  // the others are held here until the subtree completes.
  std::optional<detail::SlotCollector<CastPiece>> answers;  // made by open_node
};

// The reply port of one own member's request: encodes the reply (or error)
// into a piece for slot `slot` of `node`.
class MemberReplySink final : public detail::ReplySink {
 public:
  MemberReplySink(std::shared_ptr<CastRelay> relay, std::shared_ptr<CastRelay::Node> node, size_t slot, size_t rank)
      : relay_(std::move(relay)), node_(std::move(node)), slot_(slot), rank_(rank) {}

  void add_promise() override { promises_.fetch_add(1, std::memory_order_relaxed); }
  void drop_promise() override {
    if (promises_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (!done_.load(std::memory_order_acquire)) complete_error(absl::AbortedError("request dropped without a reply"));
      delete this;
    }
  }
  uint32_t value_type() const override { return 0; }
  bool cancelled() const override { return false; }
  PortAddress port_address() override { return PortAddress{}; }

  void complete_value(uint32_t type, void* value) override {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    CastPiece piece{rank_, 1, absl::OkStatus(), {}};
    const MessageCodec* codec = codec_for(type);
    if (codec == nullptr) {
      piece.error = absl::FailedPreconditionError(
          absl::StrCat("reply type ", std::string(detail::type_name_of(type)), " has no codec (CASTMESH_REGISTER_MESSAGE)"));
    } else if (absl::Status st = codec->encode(value, &piece.value); !st.ok()) {
      piece.error = st;
    }
    finish(std::move(piece));
  }
  void complete_error(absl::Status status) override {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    finish(CastPiece{rank_, 1, status.ok() ? absl::UnknownError("empty error") : std::move(status), {}});
  }

 private:
  void finish(CastPiece piece) {
    std::vector<CastPiece> pieces;
    pieces.push_back(std::move(piece));
    relay_->add_pieces(node_, slot_, std::move(pieces));
  }

  std::shared_ptr<CastRelay> relay_;
  std::shared_ptr<CastRelay::Node> node_;
  const size_t slot_;
  const size_t rank_;
  std::atomic<int32_t> promises_{0};
  std::atomic<bool> done_{false};
};

// ---- CastTable ----

namespace {
// The host of a proc: the host part of its TCP address; a Unix or local
// address is this host ("").
std::string host_of(const ProcId& proc) {
  absl::StatusOr<transport::ChannelAddress> address = transport::parse_channel_address(proc);
  return address.ok() && address->kind == transport::ChannelAddress::Kind::kTcp ? address->host : std::string();
}

// The groups as runs of one host each, if there are two hosts or more and
// every host's groups are one run; else nothing.
std::vector<CastSpan> host_runs(const std::vector<ProcId>& group_procs) {
  std::vector<CastSpan> runs;
  absl::flat_hash_set<std::string> seen;
  std::string previous;
  for (size_t g = 0; g < group_procs.size(); ++g) {
    std::string host = host_of(group_procs[g]);
    if (g > 0 && host == previous) {
      runs.back().end = g + 1;
      continue;
    }
    previous = host;
    if (!seen.insert(std::move(host)).second) return {};  // a host's groups are not one run
    runs.push_back(CastSpan{g, g + 1});
  }
  if (runs.size() < 2) return {};
  return runs;
}
}  // namespace

absl::StatusOr<CastTable> CastTable::Build(ProcId owner, uint64_t id, std::string name, Shape base,
                                           std::vector<Address> members) {
  if (members.size() != base.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh '", name, "' ", base.to_string(), " has ", base.size(),
                                                   " points but ", members.size(), " members"));
  }
  CastTable t;
  t.owner = std::move(owner);
  t.id = id;
  t.name = std::move(name);
  t.base = std::move(base);
  t.members = std::move(members);
  absl::flat_hash_map<ProcId, uint32_t> group_of_proc;
  t.fold_in_tree = true;
  for (size_t rank = 0; rank < t.members.size(); ++rank) {
    auto [it, inserted] = group_of_proc.try_emplace(t.members[rank].proc, static_cast<uint32_t>(t.group_procs.size()));
    if (inserted) {
      t.group_procs.push_back(t.members[rank].proc);
      t.group_ranks.emplace_back();
    }
    // Groups numbered by first appearance: a rank whose group is below its
    // predecessor's means a group's members are not one run of ranks.
    if (!t.group_of_rank.empty() && it->second < t.group_of_rank.back()) t.fold_in_tree = false;
    t.group_of_rank.push_back(it->second);
    t.group_ranks[it->second].push_back(rank);
  }
  t.host_spans = host_runs(t.group_procs);
  return t;
}

std::vector<CastSpan> CastTable::root_children(size_t fanout) const {
  if (host_spans.empty()) return cast_root_children(group_procs.size(), fanout);
  if (host_spans.size() <= fanout) return host_spans;
  // More hosts than the fan-out: `fanout` spans of whole hosts.
  std::vector<CastSpan> spans;
  for (CastSpan runs : split_cast_span(0, host_spans.size(), fanout)) {
    spans.push_back(CastSpan{host_spans[runs.begin].begin, host_spans[runs.end - 1].end});
  }
  return spans;
}

// ---- CastRelay: set-up ----

namespace {
// Every ProcHost attached in this process gets a relay. This file is always
// linked: ProcCastTree::Create (below) is what meshes call.
[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kCastRelayService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return CastRelay::install(host, host.runtime());
  });
  return true;
}();
}  // namespace

std::shared_ptr<CastRelay> CastRelay::of(const proc::ProcHost& host) {
  return std::static_pointer_cast<CastRelay>(host.service(kCastRelayService));
}

std::shared_ptr<CastRelay> CastRelay::install(proc::ProcHost& host, Runtime& runtime) {
  std::shared_ptr<CastRelay> relay(new CastRelay(&host, &runtime, host.id()));
  host.on_control(v1::CastMeshSetup().GetTypeName(),
                  [relay](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    relay->on_setup(peer, correlation, payload);
                  });
  host.on_control(v1::CastMeshDrop().GetTypeName(),
                  [relay](const ProcId&, uint64_t, const std::string& payload) { relay->on_drop(payload); });
  host.on_control(v1::CastHop().GetTypeName(), [relay](const ProcId& peer, uint64_t, const std::string& payload) {
    relay->on_hop_message(peer, payload);
  });
  host.on_control(v1::CastReply().GetTypeName(),
                  [relay](const ProcId&, uint64_t, const std::string& payload) { relay->on_reply_message(payload); });
  // Raw pointer: the observer lives in the host, which holds the relay.
  CastRelay* raw = relay.get();
  host.add_peer_lost_observer([raw](const ProcId& peer, const absl::Status& why) { raw->on_peer_lost(peer, why); });
  return relay;
}

void CastRelay::detach() {
  {
    detail::WriterMutexLock lock(host_mu_);
    host_ = nullptr;
  }
  std::vector<std::shared_ptr<Node>> nodes;
  {
    detail::MutexLock lock(mu_);
    detached_ = true;
    for (auto& [key, node] : nodes_) nodes.push_back(node);
  }
  const absl::Status gone = absl::CancelledError("this proc's transport shut down");
  for (auto& node : nodes) {
    for (size_t slot = 0; slot < node->slots.size(); ++slot) fail_slot(node, slot, gone);
  }
}

absl::Status CastRelay::send_control(const ProcId& peer, const google::protobuf::MessageLite& message) {
  detail::ReaderMutexLock lock(host_mu_);
  if (host_ == nullptr) return absl::UnavailableError("this proc's transport is shut down");
  return host_->send_control(peer, message);
}

std::shared_ptr<const CastTable> CastRelay::find_table(const ProcId& owner, uint64_t id) {
  detail::MutexLock lock(mu_);
  auto it = tables_.find(std::make_pair(owner, id));
  return it == tables_.end() ? nullptr : it->second;
}

std::vector<bool> CastRelay::lost_groups(const CastTable& table, const v1::CastHop& hop) {
  std::vector<bool> lost(table.group_procs.size(), false);
  for (uint32_t g : hop.lost_groups()) {
    if (g < lost.size()) lost[g] = true;
  }
  detail::MutexLock lock(mu_);
  if (lost_.empty()) return lost;
  for (size_t g = 0; g < lost.size(); ++g) {
    if (table.group_procs[g] != id_ && lost_.contains(table.group_procs[g])) lost[g] = true;
  }
  return lost;
}

void CastRelay::set_lost_groups(const std::vector<bool>& lost, v1::CastHop* hop) {
  hop->clear_lost_groups();
  for (size_t g = 0; g < lost.size(); ++g) {
    if (lost[g]) hop->add_lost_groups(static_cast<uint32_t>(g));
  }
}

bool CastRelay::is_lost(const ProcId& proc) {
  if (proc == id_) return false;
  detail::MutexLock lock(mu_);
  return lost_.contains(proc);
}

namespace {
std::string directory_key(const ProcId& owner, uint64_t id) { return absl::StrCat(owner, "#", id); }

// Members of this proc find their mesh there (Communicator::current).
void list_in_directory(const CastTable& table) {
  MeshDirectory::add(std::make_shared<const MeshMembership>(
      MeshMembership{directory_key(table.owner, table.id), table.name, table.base, table.members}));
}
}  // namespace

absl::Status CastRelay::install_table(const std::shared_ptr<const CastTable>& table) {
  {
    detail::MutexLock lock(mu_);
    tables_[std::make_pair(table->owner, table->id)] = table;
  }
  list_in_directory(*table);
  v1::CastMeshSetup setup;
  setup.set_owner(table->owner);
  setup.set_mesh_id(table->id);
  setup.set_name(table->name);
  for (const std::string& label : table->base.labels()) setup.add_labels(label);
  for (size_t size : table->base.sizes()) setup.add_sizes(size);
  for (const Address& m : table->members) setup.add_members(m.to_string());
  for (const ProcId& p : table->group_procs) setup.add_group_procs(p);
  for (uint32_t g : table->group_of_rank) setup.add_group_of_rank(g);
  setup.set_fold_in_tree(table->fold_in_tree);
  for (const ProcId& proc : table->group_procs) {
    if (proc == id_) continue;
    absl::StatusOr<std::string> answer;
    {
      detail::ReaderMutexLock lock(host_mu_);
      if (host_ == nullptr) return absl::UnavailableError("this proc's transport is shut down");
      answer = host_->request(proc, setup, absl::Seconds(30));
    }
    v1::CastMeshSetupReply reply;
    absl::Status st = answer.status();
    if (st.ok() && !reply.ParseFromString(*answer)) st = absl::InternalError("malformed CastMeshSetupReply");
    if (st.ok()) st = wire::status_from_wire(reply);
    if (!st.ok()) {
      drop_table(*table);
      return absl::Status(st.code(), absl::StrCat("installing the cast tree of mesh '", table->name, "' in proc ",
                                                  proc, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

void CastRelay::drop_table(const CastTable& table) {
  {
    detail::MutexLock lock(mu_);
    tables_.erase(std::make_pair(table.owner, table.id));
  }
  MeshDirectory::remove(directory_key(table.owner, table.id));
  v1::CastMeshDrop drop;
  drop.set_owner(table.owner);
  drop.set_mesh_id(table.id);
  for (const ProcId& proc : table.group_procs) {
    if (proc != id_ && !is_lost(proc)) (void)send_control(proc, drop);
  }
}

void CastRelay::on_setup(const ProcId& peer, uint64_t correlation, const std::string& payload) {
  v1::CastMeshSetupReply reply;
  auto fail = [&](const absl::Status& st) {
    wire::status_to_wire(st, &reply);
  };
  v1::CastMeshSetup setup;
  if (!setup.ParseFromString(payload)) {
    fail(absl::InvalidArgumentError("malformed CastMeshSetup"));
  } else {
    std::vector<std::pair<std::string, size_t>> dims;
    for (int i = 0; i < setup.labels_size() && i < setup.sizes_size(); ++i) dims.emplace_back(setup.labels(i), setup.sizes(i));
    absl::StatusOr<Shape> base = Shape::Create(dims);
    std::vector<Address> members;
    absl::Status st = base.status();
    for (const std::string& m : setup.members()) {
      if (!st.ok()) break;
      absl::StatusOr<Address> a = Address::parse(m);
      if (a.ok()) members.push_back(*std::move(a));
      st = a.status();
    }
    absl::StatusOr<CastTable> table = st.ok() ? CastTable::Build(setup.owner(), setup.mesh_id(), setup.name(),
                                                                 *std::move(base), std::move(members))
                                              : absl::StatusOr<CastTable>(st);
    // The groups are recomputed here from the same members; they must agree.
    if (table.ok() && (table->group_procs.size() != static_cast<size_t>(setup.group_procs_size()) ||
                       !std::equal(table->group_procs.begin(), table->group_procs.end(), setup.group_procs().begin()))) {
      table = absl::InvalidArgumentError("CastMeshSetup: groups do not match the members");
    }
    if (!table.ok()) {
      fail(table.status());
    } else {
      auto shared = std::make_shared<const CastTable>(*std::move(table));
      list_in_directory(*shared);
      detail::MutexLock lock(mu_);
      tables_[std::make_pair(shared->owner, shared->id)] = shared;
    }
  }
  detail::ReaderMutexLock lock(host_mu_);
  if (host_ != nullptr) (void)host_->send_control(peer, reply, correlation, /*is_reply=*/true);
}

void CastRelay::on_drop(const std::string& payload) {
  v1::CastMeshDrop drop;
  if (!drop.ParseFromString(payload)) return;
  MeshDirectory::remove(directory_key(drop.owner(), drop.mesh_id()));
  detail::MutexLock lock(mu_);
  tables_.erase(std::make_pair(drop.owner(), drop.mesh_id()));
}

// ---- nodes ----

void CastRelay::register_node(const std::shared_ptr<Node>& node) {
  detail::MutexLock lock(mu_);
  nodes_[std::make_tuple(node->owner, node->request, node->span)] = node;
}

void CastRelay::forget_node(const Node& node) {
  detail::MutexLock lock(mu_);
  nodes_.erase(std::make_tuple(node.owner, node.request, node.span));
}

void CastRelay::add_pieces(const std::shared_ptr<Node>& node, size_t slot, std::vector<CastPiece> pieces) {
  const Node::Slot& s = node->slots[slot];
  const bool pass_through = node->pass_through || node->mode == CastMode::kStream;
  std::vector<CastPiece> now;
  std::optional<std::vector<CastPiece>> answered;
  for (CastPiece& p : pieces) {
    auto it = std::lower_bound(s.ranks.begin(), s.ranks.end(), p.first_rank);
    if (it == s.ranks.end() || *it != p.first_rank) {
      CASTMESH_LOG_WARN("cast relay {}: reply for rank {} is not a target of its slot; dropped", id_, p.first_rank);
      continue;
    }
    const size_t index = static_cast<size_t>(it - s.ranks.begin());
    const size_t width = std::min<size_t>(p.count, s.ranks.size() - index);  // a run never spills into the next slot
    const bool send_now = pass_through || !p.error.ok();
    // A repeat (e.g. failed on a loss, then answered) is not stored.
    detail::SlotFill<CastPiece> fill = node->answers->set(
        s.first_target + index, send_now ? CastPiece{p.first_rank, p.count, p.error, {}} : std::move(p), width);
    if (fill.stored && send_now) now.push_back(std::move(p));
    if (fill.done) answered = std::move(fill.done);
  }
  std::vector<CastPiece> final_pieces;
  bool fold = false;
  if (answered) {
    forget_node(*node);
    bool errored = false;
    for (CastPiece& p : *answered) {
      if (!p.error.ok()) {
        errored = true;
      } else if (!pass_through) {
        final_pieces.push_back(std::move(p));
      }
    }
    fold = node->fold != nullptr && !errored;
  }
  if (fold && final_pieces.size() > 1) {
    // Slots are in rank order (fold_in_tree): left to right is row-major.
    std::string value = final_pieces[0].value;
    size_t count = final_pieces[0].count;
    absl::Status st;
    for (size_t i = 1; i < final_pieces.size() && st.ok(); ++i) {
      absl::StatusOr<std::string> folded = (*node->fold)(value, final_pieces[i].value);
      if (folded.ok()) {
        value = *std::move(folded);
        count += final_pieces[i].count;
      } else {
        st = folded.status();
      }
    }
    if (st.ok()) {
      const size_t first = final_pieces[0].first_rank;
      final_pieces.clear();
      final_pieces.push_back(CastPiece{first, count, absl::OkStatus(), std::move(value)});
    } else {
      CASTMESH_LOG_WARN("cast relay {}: folding failed ({}); passing the values up", id_, st.ToString());
    }
  }
  if (!now.empty()) send_up(*node, std::move(now));
  if (!final_pieces.empty()) send_up(*node, std::move(final_pieces));
}

void CastRelay::fail_slot(const std::shared_ptr<Node>& node, size_t slot, const absl::Status& error) {
  // Every target of the slot; the collector ignores those that answered.
  std::vector<CastPiece> pieces;
  for (size_t rank : node->slots[slot].ranks) pieces.push_back(CastPiece{rank, 1, error, {}});
  add_pieces(node, slot, std::move(pieces));
}

void CastRelay::send_up(const Node& node, std::vector<CastPiece> pieces) {
  if (node.parent.proc.empty()) {
    if (node.parent.handler) node.parent.handler(std::move(pieces));
    return;
  }
  v1::CastReply reply;
  reply.set_owner(node.owner);
  reply.set_request(node.request);
  reply.set_span(node.parent.span);
  reply.set_slot(node.parent.slot);
  for (CastPiece& p : pieces) {
    v1::CastPiece* w = reply.add_pieces();
    w->set_first_rank(p.first_rank);
    w->set_count(p.count);
    if (p.error.ok()) {
      w->set_value(std::move(p.value));
    } else {
      wire::status_to_wire(p.error, w);
    }
  }
  if (node.parent.proc == id_) {
    handle_reply(reply);
    return;
  }
  if (absl::Status st = send_control(node.parent.proc, reply); !st.ok()) {
    CASTMESH_LOG_DEBUG("cast relay {}: replies for request {} lost: {}", id_, node.request, st.ToString());
  }
}

// ---- hops ----

namespace {

// Targets of a hop: which base ranks, and per span of groups which of them.
struct Targets {
  std::vector<bool> is_target;  // by base rank

  std::vector<size_t> in_group(const CastTable& t, size_t group) const {
    std::vector<size_t> out;
    for (size_t r : t.group_ranks[group]) {
      if (is_target[r]) out.push_back(r);
    }
    return out;
  }
  std::vector<size_t> in_span(const CastTable& t, CastSpan span) const {
    std::vector<size_t> out;
    for (size_t g = span.begin; g < span.end; ++g) {
      for (size_t r : t.group_ranks[g]) {
        if (is_target[r]) out.push_back(r);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

absl::StatusOr<Targets> targets_of(const CastTable& table, const v1::CastHop& hop) {
  absl::StatusOr<Slice> view =
      Slice::Create(hop.view_offset(), std::vector<size_t>(hop.view_sizes().begin(), hop.view_sizes().end()),
                    std::vector<size_t>(hop.view_strides().begin(), hop.view_strides().end()));
  if (!view.ok()) return view.status();
  Targets t;
  t.is_target.assign(table.members.size(), false);
  for (size_t r : view->ranks()) {
    if (r >= t.is_target.size()) {
      return absl::OutOfRangeError(absl::StrCat("cast target rank ", r, " is outside mesh '", table.name, "'"));
    }
    t.is_target[r] = true;
  }
  return t;
}

}  // namespace

// Where a request goes below a node: the child spans holding targets (with
// their targets) and the targets on procs known to be lost.
struct CastRelay::ChildPlan {
  std::vector<CastSpan> spans;
  std::vector<std::vector<size_t>> targets;  // by span
  std::vector<std::pair<ProcId, std::vector<size_t>>> unreachable;
};

namespace {
// Plans the children of a node among `spans`: a span whose first group's
// proc is known to be lost is skipped over: its own targets are unreachable
// (lost proc, its targets), its children are adopted.
void plan_children(const CastTable& table, const Targets& targets, std::vector<CastSpan> spans, size_t fanout,
                   const std::vector<bool>& lost, CastRelay::ChildPlan* plan) {
  for (CastSpan span : spans) {
    std::vector<size_t> in = targets.in_span(table, span);
    if (in.empty()) continue;
    const ProcId& proc = table.group_procs[span.begin];
    if (lost[span.begin]) {
      if (std::vector<size_t> own = targets.in_group(table, span.begin); !own.empty()) {
        plan->unreachable.emplace_back(proc, std::move(own));
      }
      plan_children(table, targets, cast_node_children(span, fanout), fanout, lost, plan);
      continue;
    }
    plan->spans.push_back(span);
    plan->targets.push_back(std::move(in));
  }
}
}  // namespace

void CastRelay::open_node(const std::shared_ptr<Node>& node, const CastTable& table, const ChildPlan& plan) {
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    node->slots.push_back(Node::Slot{table.group_procs[plan.spans[i].begin], plan.targets[i]});
  }
  for (const auto& [proc, ranks] : plan.unreachable) node->slots.push_back(Node::Slot{proc, ranks});
  size_t targets = 0;
  for (Node::Slot& slot : node->slots) {
    slot.first_target = targets;
    targets += slot.ranks.size();
  }
  node->answers.emplace(targets);
  register_node(node);
}

void CastRelay::send_to_children(const std::shared_ptr<const CastTable>& table, v1::CastHop& hop,
                                 const ChildPlan& plan, const std::shared_ptr<Node>& node, size_t first_child_slot) {
  forward(table, hop, plan.spans, node, first_child_slot);
  if (!node) return;
  for (size_t i = 0; i < plan.unreachable.size(); ++i) {
    fail_slot(node, first_child_slot + plan.spans.size() + i,
              absl::UnavailableError(absl::StrCat("proc ", plan.unreachable[i].first, " is gone")));
  }
}

void CastRelay::forward(const std::shared_ptr<const CastTable>& table, v1::CastHop& hop,
                        const std::vector<CastSpan>& spans, const std::shared_ptr<Node>& node,
                        size_t first_child_slot) {
  const uint64_t my_span = node ? node->span : 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    hop.set_span_begin(spans[i].begin);
    hop.set_span_end(spans[i].end);
    if (node) {
      hop.set_reply_proc(id_);
      hop.set_reply_span(my_span);
      hop.set_reply_slot(static_cast<uint32_t>(first_child_slot + i));
    }
    const ProcId& proc = table->group_procs[spans[i].begin];
    if (proc == id_) {  // the caller's own proc holds members of the mesh
      handle_hop(table, hop);
      continue;
    }
    absl::Status st = send_control(proc, hop);
    if (st.ok()) {
      hops_sent_.fetch_add(1, std::memory_order_relaxed);
    } else if (node) {
      fail_slot(node, first_child_slot + i, absl::UnavailableError(absl::StrCat("cannot send to proc ", proc, ": ", st.message())));
    } else {
      CASTMESH_LOG_DEBUG("cast relay {}: cast to proc {} dropped: {}", id_, proc, st.ToString());
    }
  }
}

void CastRelay::handle_hop(const std::shared_ptr<const CastTable>& table, const v1::CastHop& hop) {
  const CastMode mode = mode_of(hop.mode());
  const bool request = mode != CastMode::kTell;
  absl::StatusOr<Targets> targets = targets_of(*table, hop);
  const CastSpan span{hop.span_begin(), hop.span_end()};
  if (targets.ok() && (span.begin >= span.end || span.end > table->group_procs.size())) {
    targets = absl::InvalidArgumentError(absl::StrCat("bad cast span [", span.begin, ", ", span.end, ")"));
  }
  if (!targets.ok()) {
    CASTMESH_LOG_WARN("cast relay {}: bad hop for mesh '{}': {}", id_, table->name, targets.status().ToString());
    if (request) {
      v1::CastReply reply;
      reply.set_owner(hop.owner());
      reply.set_request(hop.request());
      reply.set_span(hop.reply_span());
      reply.set_slot(hop.reply_slot());
      reply.set_slot_error_code(static_cast<int>(targets.status().code()));
      reply.set_slot_error_message(std::string(targets.status().message()));
      if (hop.reply_proc() == id_) {
        handle_reply(reply);
      } else {
        (void)send_control(hop.reply_proc(), reply);
      }
    }
    return;
  }
  const size_t fanout = std::max<uint64_t>(hop.fanout(), 1);
  const std::vector<size_t> own = targets->in_group(*table, span.begin);
  ChildPlan plan;
  const std::vector<bool> lost = lost_groups(*table, hop);
  plan_children(*table, *targets, cast_node_children(span, fanout), fanout, lost, &plan);

  std::shared_ptr<Node> node;
  if (request) {
    node = std::make_shared<Node>();
    node->owner = hop.owner();
    node->request = hop.request();
    node->span = span.begin;
    node->mode = mode;
    node->parent = Parent{hop.reply_proc(), hop.reply_span(), hop.reply_slot(), nullptr};
    if (mode == CastMode::kReduce && table->fold_in_tree && !hop.reducer().empty()) {
      node->fold = detail::find_encoded_fold(hop.reducer(), hop.reducer_type());
    }
    for (size_t r : own) node->slots.push_back(Node::Slot{id_, {r}});
    open_node(node, *table, plan);
  }
  // Children first, so they start early; then the own members.
  v1::CastHop child = hop;
  set_lost_groups(lost, &child);
  send_to_children(table, child, plan, node, own.size());
  detail::RuntimeCore* core = detail::RuntimeTransportSeam::core(*runtime_);
  for (size_t i = 0; i < own.size(); ++i) {
    const Address& member = table->members[own[i]];
    if (!node) {
      absl::Status st =
          detail::RuntimeTransportSeam::deliver_serialized(*runtime_, member, hop.message_type(), hop.message());
      if (!st.ok()) CASTMESH_LOG_DEBUG("cast relay {}: cast to {} not delivered: {}", id_, member.to_string(), st.ToString());
      continue;
    }
    auto* sink = new MemberReplySink(shared_from_this(), node, i, own[i]);
    const uint64_t port = core->register_reply(sink, id_);
    // A failure completes the reply port with the error (and so the slot).
    (void)detail::RuntimeTransportSeam::deliver_serialized(*runtime_, member, hop.message_type(), hop.message(),
                                                           PortAddress{core->reply_owner(), port});
  }
}

void CastRelay::on_hop_message(const ProcId& peer, const std::string& payload) {
  v1::CastHop hop;
  if (!hop.ParseFromString(payload)) {
    CASTMESH_LOG_WARN("cast relay {}: malformed CastHop from {}", id_, peer);
    return;
  }
  std::shared_ptr<const CastTable> table = find_table(hop.owner(), hop.mesh_id());
  if (table != nullptr) {
    handle_hop(table, hop);
    return;
  }
  CASTMESH_LOG_DEBUG("cast relay {}: hop for unknown mesh {} of {}", id_, hop.mesh_id(), hop.owner());
  if (hop.mode() == v1::CastHop::MODE_TELL) return;
  v1::CastReply reply;
  reply.set_owner(hop.owner());
  reply.set_request(hop.request());
  reply.set_span(hop.reply_span());
  reply.set_slot(hop.reply_slot());
  reply.set_slot_error_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  reply.set_slot_error_message(absl::StrCat("proc ", id_, " does not know mesh ", hop.mesh_id(), " (dropped?)"));
  (void)send_control(hop.reply_proc().empty() ? peer : hop.reply_proc(), reply);
}

void CastRelay::on_reply_message(const std::string& payload) {
  v1::CastReply reply;
  if (!reply.ParseFromString(payload)) {
    CASTMESH_LOG_WARN("cast relay {}: malformed CastReply", id_);
    return;
  }
  replies_received_.fetch_add(1, std::memory_order_relaxed);
  pieces_received_.fetch_add(static_cast<uint64_t>(reply.pieces_size()), std::memory_order_relaxed);
  handle_reply(reply);
}

void CastRelay::handle_reply(const v1::CastReply& reply) {
  std::shared_ptr<Node> node;
  {
    detail::MutexLock lock(mu_);
    auto it = nodes_.find(std::make_tuple(reply.owner(), reply.request(), reply.span()));
    if (it != nodes_.end()) node = it->second;
  }
  if (node == nullptr || reply.slot() >= node->slots.size()) return;  // finished (e.g. failed on a loss)
  std::vector<CastPiece> pieces;
  pieces.reserve(reply.pieces_size());
  for (const v1::CastPiece& p : reply.pieces()) {
    pieces.push_back(CastPiece{p.first_rank(), std::max<uint64_t>(p.count(), 1),
                               wire::status_from_wire(p), p.value()});
  }
  if (!pieces.empty()) add_pieces(node, reply.slot(), std::move(pieces));
  if (reply.slot_error_code() != 0) {
    fail_slot(node, reply.slot(), wire::status_from_wire(reply.slot_error_code(), reply.slot_error_message()));
  }
}

void CastRelay::on_peer_lost(const ProcId& peer, const absl::Status& why) {
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> failed;
  {
    detail::MutexLock lock(mu_);
    lost_.insert(peer);
    for (auto& [key, node] : nodes_) {
      for (size_t slot = 0; slot < node->slots.size(); ++slot) {
        if (node->slots[slot].proc == peer) failed.emplace_back(node, slot);
      }
    }
  }
  for (auto& [node, slot] : failed) fail_slot(node, slot, why);
}

absl::Status CastRelay::launch(const std::shared_ptr<const CastTable>& table, detail::CastRequest request,
                               detail::CastPiecesHandler on_pieces) {
  {
    detail::ReaderMutexLock lock(host_mu_);
    if (host_ == nullptr) return absl::UnavailableError("this proc's transport is shut down");
  }
  v1::CastHop hop;
  hop.set_owner(table->owner);
  hop.set_mesh_id(table->id);
  hop.set_view_offset(request.view.offset());
  for (size_t s : request.view.sizes()) hop.add_view_sizes(s);
  for (size_t s : request.view.strides()) hop.add_view_strides(s);
  const size_t fanout = std::max<size_t>(request.fanout, 1);
  hop.set_fanout(fanout);
  hop.set_mode(wire_mode(request.mode));
  hop.set_message_type(std::move(request.message_type));
  hop.set_message(std::move(request.message));
  if (request.mode == CastMode::kReduce && table->fold_in_tree) {
    hop.set_reducer(std::move(request.reducer));
    hop.set_reducer_type(std::move(request.reducer_type));
  }
  absl::StatusOr<Targets> targets = targets_of(*table, hop);
  if (!targets.ok()) return targets.status();
  ChildPlan plan;
  const std::vector<bool> lost = lost_groups(*table, hop);
  set_lost_groups(lost, &hop);
  plan_children(*table, *targets, table->root_children(fanout), fanout, lost, &plan);
  std::shared_ptr<Node> node;
  if (request.mode != CastMode::kTell) {
    hop.set_request(next_request_.fetch_add(1, std::memory_order_relaxed));
    node = std::make_shared<Node>();
    node->owner = table->owner;
    node->request = hop.request();
    node->span = kRootSpan;
    node->mode = request.mode;
    node->parent = Parent{ProcId(), 0, 0, std::move(on_pieces)};
    node->pass_through = true;
    open_node(node, *table, plan);
  }
  send_to_children(table, hop, plan, node, 0);
  return absl::OkStatus();
}

}  // namespace castmesh::mesh

// ---- ProcCastTree ----

namespace castmesh::detail {

absl::StatusOr<std::shared_ptr<ProcCastTree>> ProcCastTree::Create(Runtime& runtime, const std::string& mesh_name,
                                                                    const Shape& base,
                                                                    const std::vector<Address>& members) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  if (host == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh_name, "' has members in other procs, but this runtime is not a proc (allocate procs first)"));
  }
  std::shared_ptr<mesh::CastRelay> relay = mesh::CastRelay::of(*host);
  if (relay == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("mesh '", mesh_name, "': this proc has no cast relay (proc service '",
                                                      mesh::kCastRelayService, "')"));
  }
  absl::StatusOr<mesh::CastTable> table =
      mesh::CastTable::Build(host->id(), relay->next_mesh_id(), mesh_name, base, members);
  if (!table.ok()) return table.status();
  auto shared = std::make_shared<const mesh::CastTable>(*std::move(table));
  if (absl::Status st = relay->install_table(shared); !st.ok()) return st;
  return std::shared_ptr<ProcCastTree>(new ProcCastTree(std::move(relay), std::move(shared)));
}

ProcCastTree::~ProcCastTree() { relay_->drop_table(*table_); }

absl::Status ProcCastTree::send(CastRequest request, CastPiecesHandler on_pieces) const {
  return relay_->launch(table_, std::move(request), std::move(on_pieces));
}

size_t ProcCastTree::procs() const { return table_->group_procs.size(); }
bool ProcCastTree::folds_in_tree() const { return table_->fold_in_tree; }

}  // namespace castmesh::detail
