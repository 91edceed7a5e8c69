// Internal: the typed half of a mesh's casts and requests. ActorMesh makes
// one MeshCall per cast or request (TellCall, GatherCall, StreamCall,
// ReduceCall: the message, the reply type, where the replies go); the
// mesh's router (detail/mesh_router.h) calls back into it, in process to
// deliver typed messages and fold typed replies, across procs to encode
// the message once and decode the replies' pieces. Public only because
// ActorMesh is a template.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mesh_reply.h"
#include "castmesh/detail/mesh_router.h"
#include "castmesh/detail/mesh_state.h"
#include "castmesh/detail/proc_cast.h"
#include "castmesh/detail/slot_collector.h"
#include "castmesh/message.h"
#include "castmesh/port.h"
#include "castmesh/ref.h"
#include "castmesh/shape.h"
#include "castmesh/value_mesh.h"

namespace castmesh::detail {

// A continuation that resolves `port` with a request's result.
template <typename T>
std::function<void(absl::StatusOr<T>)> resolve_port(OncePort<T> port) {
  return [port = std::move(port)](absl::StatusOr<T> r) {
    if (r.ok()) {
      port.send(*std::move(r));
    } else {
      port.fail(std::move(r).status());
    }
  };
}

// Encodes a mesh message once for the per-proc tree.
template <typename M>
absl::Status encode_cast(const M& msg, CastRequest* request) {
  ensure_codec<M>();
  const MessageCodec* codec = codec_for(type_id<M>());
  if (codec == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("message type ", std::string(type_name<M>()),
                                                      " has no codec, and the mesh has members in other procs "
                                                      "(CASTMESH_REGISTER_MESSAGE)"));
  }
  request->message_type = codec->wire_name;
  return codec->encode(&msg, &request->message);
}

// Decodes the value of a reply that came up the per-proc tree.
template <typename R>
absl::StatusOr<R> decode_piece(const CastPiece& piece) {
  R value{};
  if (absl::Status st = decode_value(piece.value, &value); !st.ok()) return st;
  return value;
}

// The error of a batch of pieces holding failures: the first failed
// target's error naming its point, followed by the batch's other failed
// points (a lost subtree fails all its targets in one batch). nullopt when
// every piece is a value.
inline std::optional<absl::Status> pieces_error(const Shape& base, const std::vector<CastPiece>& pieces) {
  const CastPiece* first = nullptr;
  std::vector<std::string> others;
  for (const CastPiece& p : pieces) {
    if (p.error.ok()) continue;
    if (first == nullptr) {
      first = &p;
    } else {
      others.push_back(base.point_at(p.first_rank)->to_string());
    }
  }
  if (first == nullptr) return std::nullopt;
  absl::Status error = member_error(*base.point_at(first->first_rank), first->error);
  if (others.empty()) return error;
  return absl::Status(error.code(),
                      absl::StrCat(error.message(), " (also failed: ", absl::StrJoin(others, ", "), ")"));
}

// The caller's end of a reduction over the per-proc tree: pieces (each a
// run of targets, folded by relays where they could) arrive in any order,
// each counted in for the run of view positions it covers; once they cover
// every target they are folded in row-major order. The first batch holding
// an error fails the reduction. Thread-safe.
template <typename R>
class PieceFold {
 public:
  using Done = std::function<void(absl::StatusOr<R>)>;
  PieceFold(Slice view, Reducer<R> reducer, Shape base, Done done)
      : view_(std::move(view)), slots_(view_.size()), reducer_(std::move(reducer)), base_(std::move(base)),
        done_(std::move(done)) {}

  // A batch of pieces from the tree (any thread).
  void add(std::vector<CastPiece> batch) {
    if (std::optional<absl::Status> error = pieces_error(base_, batch)) {
      if (slots_.fail()) done_(*std::move(error));
      return;
    }
    for (CastPiece& p : batch) {
      absl::StatusOr<size_t> position = view_.position_of(p.first_rank);
      if (!position.ok()) {  // relays pass up only their slots' targets
        if (slots_.fail()) done_(absl::InternalError(absl::StrCat("reply for rank ", p.first_rank, " outside the view")));
        return;
      }
      const size_t count = p.count;
      SlotFill<CastPiece> fill = slots_.set(*position, std::move(p), count);
      if (fill.done) finish(*std::move(fill.done));
    }
  }

 private:
  // Every target answered: decodes and folds the pieces in row-major order.
  void finish(std::vector<CastPiece> all) {
    std::optional<R> folded;
    for (const CastPiece& p : all) {
      absl::StatusOr<R> v = decode_piece<R>(p);
      if (!v.ok()) {
        done_(member_error(*base_.point_at(p.first_rank), v.status()));
        return;
      }
      folded = folded ? reducer_.combine(std::move(*folded), *std::move(v)) : *std::move(v);
    }
    done_(std::move(*folded));
  }

  const Slice view_;
  SlotCollector<CastPiece> slots_;  // by position in view_
  const Reducer<R> reducer_;
  const Shape base_;
  const Done done_;
};

// cast(): the message, delivered to every live target.
template <typename A, typename M>
class TellCall final : public MeshCall {
 public:
  TellCall(std::shared_ptr<MeshState> mesh, M msg) : MeshCall(std::move(mesh)), msg_(std::move(msg)) {}

  void deliver(size_t rank, const std::shared_ptr<void>&) const override {
    if (!mesh().is_dead(rank)) ActorRef<A>(mesh().member(rank).destination()).tell(M(msg_));
  }
  absl::Status encode(CastRequest* request) const override { return encode_cast(msg_, request); }

 private:
  const M msg_;
};

// call(): a reply per target into a ReplyGather (its shape is the view).
template <typename A, typename M, typename R>
class GatherCall final : public MeshCall {
 public:
  GatherCall(std::shared_ptr<MeshState> mesh, M msg, std::shared_ptr<ReplyGather<R>> gather)
      : MeshCall(std::move(mesh)), msg_(std::move(msg)), gather_(std::move(gather)) {}

  void deliver(size_t rank, const std::shared_ptr<void>&) const override {
    const size_t position = *gather_->shape().slice().position_of(rank);
    ActorRef<A>(mesh().member(rank).destination())
        .ask(M(msg_))
        .on_ready([g = gather_, position, base = base_point(rank)](absl::StatusOr<R> r) {
          if (r.ok()) {
            g->set_value(position, std::move(*r));
          } else {
            g->fail(member_error(base, r.status()));
          }
        });
  }
  absl::Status encode(CastRequest* request) const override { return encode_cast(msg_, request); }
  CastPiecesHandler on_pieces() const override {
    return [g = gather_, base = mesh().base()](std::vector<CastPiece> pieces) {
      if (std::optional<absl::Status> error = pieces_error(base, pieces)) {
        g->fail(*std::move(error));
        return;
      }
      for (const CastPiece& p : pieces) {
        absl::StatusOr<R> v = decode_piece<R>(p);
        if (!v.ok()) {
          g->fail(member_error(*base.point_at(p.first_rank), v.status()));
          return;
        }
        g->set_value(*g->shape().slice().position_of(p.first_rank), *std::move(v));
      }
    };
  }
  void fail(absl::Status error) const override { gather_->fail(std::move(error)); }

 private:
  const M msg_;
  const std::shared_ptr<ReplyGather<R>> gather_;
};

// stream(): each target's reply or error pushed to a ReplyQueue.
template <typename A, typename M, typename R>
class StreamCall final : public MeshCall {
 public:
  StreamCall(std::shared_ptr<MeshState> mesh, Shape view, M msg, std::shared_ptr<ReplyQueue<R>> queue)
      : MeshCall(std::move(mesh)), view_(std::move(view)), msg_(std::move(msg)), queue_(std::move(queue)) {}

  void deliver(size_t rank, const std::shared_ptr<void>&) const override {
    ActorRef<A>(mesh().member(rank).destination())
        .ask(M(msg_))
        .on_ready([q = queue_, point = *view_.point_of_rank(rank), base = base_point(rank)](absl::StatusOr<R> r) {
          if (!r.ok()) r = member_error(base, r.status());
          q->push(point, std::move(r));
        });
  }
  absl::Status encode(CastRequest* request) const override { return encode_cast(msg_, request); }
  CastPiecesHandler on_pieces() const override {
    return [q = queue_, view = view_, base = mesh().base()](std::vector<CastPiece> pieces) {
      for (const CastPiece& p : pieces) {
        absl::StatusOr<R> v = p.error.ok() ? decode_piece<R>(p) : absl::StatusOr<R>(p.error);
        if (!v.ok()) v = member_error(*base.point_at(p.first_rank), v.status());
        q->push(*view.point_of_rank(p.first_rank), std::move(v));
      }
    };
  }
  // Every point of the view gets `error`.
  void fail(absl::Status error) const override {
    for (const Point& p : view_.points()) queue_->push(p, error);
  }

 private:
  const Shape view_;
  const M msg_;
  const std::shared_ptr<ReplyQueue<R>> queue_;
};

// call(msg, reducer): in process a ReduceNode per hop folds its member's
// reply and its children's results; across procs the relays fold where
// they can and a PieceFold folds the rest.
template <typename A, typename M, typename R>
class ReduceCall final : public MeshCall {
 public:
  using Done = std::function<void(absl::StatusOr<R>)>;
  ReduceCall(std::shared_ptr<MeshState> mesh, Slice view, M msg, Reducer<R> reducer, Done done)
      : MeshCall(std::move(mesh)), view_(std::move(view)), msg_(std::move(msg)), reducer_(std::move(reducer)),
        done_(std::move(done)) {}

  std::shared_ptr<void> open_node(size_t slots, const std::shared_ptr<void>& parent,
                                  size_t parent_slot) const override {
    if (parent == nullptr) return std::make_shared<ReduceNode<R>>(slots, reducer_, done_);
    auto up = std::static_pointer_cast<ReduceNode<R>>(parent);
    return std::make_shared<ReduceNode<R>>(slots, reducer_, [up, parent_slot](absl::StatusOr<R> r) {
      if (r.ok()) {
        up->set_value(parent_slot, std::move(*r));
      } else {
        up->fail(std::move(r).status());
      }
    });
  }
  void deliver(size_t rank, const std::shared_ptr<void>& node) const override {
    ActorRef<A>(mesh().member(rank).destination())
        .ask(M(msg_))
        .on_ready([n = std::static_pointer_cast<ReduceNode<R>>(node), base = base_point(rank)](absl::StatusOr<R> r) {
          if (r.ok()) {
            n->set_value(0, std::move(*r));
          } else {
            n->fail(member_error(base, r.status()));
          }
        });
  }
  absl::Status encode(CastRequest* request) const override {
    if (reducer_.registered) {
      request->reducer = reducer_.name;
      request->reducer_type = std::string(type_name<R>());
    }
    return encode_cast(msg_, request);
  }
  CastPiecesHandler on_pieces() const override {
    auto fold = std::make_shared<PieceFold<R>>(view_, reducer_, mesh().base(), done_);
    return [fold](std::vector<CastPiece> pieces) { fold->add(std::move(pieces)); };
  }
  void fail(absl::Status error) const override { done_(std::move(error)); }

 private:
  const Slice view_;
  const M msg_;
  const Reducer<R> reducer_;
  const Done done_;
};

}  // namespace castmesh::detail
