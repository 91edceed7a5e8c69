// Internal: the cast tree of an actor mesh whose members live in other
// procs. Used by ActorMesh; public only because ActorMesh is a template.
//
// Every proc has one cast relay (src/core/mesh/cast_relay.h), a per-proc
// system forwarder served on the proc's I/O thread. The tree's nodes are the
// procs that hold members ("groups", in the order their first member
// appears in row-major order), so the caller sends at most `fanout` wire
// messages per cast whatever the mesh's size, and each relay delivers to its
// own members (RuntimeTransportSeam::deliver_serialized) and forwards to at most `fanout`
// child procs. Replies come back up the same tree: each relay sends its
// subtree's replies to its parent in one message, folded into one value for
// a reduction whose reducer is registered (Reducer::registered). Wire form:
// proto/castmesh/wire/v1/cast.proto. See docs/meshes.md.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/address.h"
#include "castmesh/shape.h"

namespace castmesh {
class Runtime;
namespace mesh {
class CastRelay;
struct CastTable;
}  // namespace mesh
namespace detail {

// A reply of a mesh request that came back up the per-proc tree: the value
// of `count` consecutive targets (in row-major order) starting at base rank
// `first_rank` (count > 1: folded by relays), or the error of the target
// `first_rank` (its proc is gone, its request failed). Plain value.
struct CastPiece {
  size_t first_rank = 0;
  size_t count = 1;
  absl::Status error;  // non-OK: that target failed
  std::string value;   // the reply, encoded with its type's codec
};

enum class CastMode {
  kTell,    // fire and forget
  kGather,  // a reply per target
  kStream,  // a reply per target, each passed up as soon as it arrives
  kReduce,  // like kGather; relays that know `reducer` fold their subtree's replies
};

// One cast or request over the per-proc tree. Plain value.
struct CastRequest {
  CastMode mode = CastMode::kTell;
  Slice view;                // the targeted base ranks
  size_t fanout = 8;
  std::string message_type;  // the message codec's wire name
  std::string message;       // the encoded message (encoded once, by the caller)
  std::string reducer;       // kReduce: a registered reducer's name; "": relays never fold
  std::string reducer_type;  // its value type, type_name<R>()
};

// Receives the replies of a request in batches, from any thread (a relay's
// I/O thread or an actor's), each target exactly once overall: errors as
// soon as they are known, values when a subtree completes. Must not block.
using CastPiecesHandler = std::function<void(std::vector<CastPiece>)>;

// The per-proc cast tree of one mesh, on the caller's side. Thread-safe;
// owned by the mesh's shared state. Destroying it forgets the mesh's table
// in every proc.
class ProcCastTree {
 public:
  // Installs the mesh's table (members, groups) in the relay of every proc
  // that holds a member; blocks until each has answered. `runtime` must be
  // a proc (LocalAllocator::allocate attached it). Errors: it is not, a proc
  // did not answer (it is gone).
  static absl::StatusOr<std::shared_ptr<ProcCastTree>> Create(Runtime& runtime, const std::string& mesh_name,
                                                              const Shape& base, const std::vector<Address>& members);
  ~ProcCastTree();
  ProcCastTree(const ProcCastTree&) = delete;
  ProcCastTree& operator=(const ProcCastTree&) = delete;

  // Sends `request` down the tree. For kGather/kStream/kReduce, `on_pieces`
  // receives every target's reply or error. Errors (nothing sent): this
  // proc's transport is shut down.
  absl::Status send(CastRequest request, CastPiecesHandler on_pieces) const;

  // Number of procs (tree nodes) holding members.
  size_t procs() const;
  // Whether relays may fold reductions (each proc's members are one
  // contiguous run of ranks, procs in rank order); else the caller folds.
  bool folds_in_tree() const;

 private:
  ProcCastTree(std::shared_ptr<mesh::CastRelay> relay, std::shared_ptr<const mesh::CastTable> table)
      : relay_(std::move(relay)), table_(std::move(table)) {}
  std::shared_ptr<mesh::CastRelay> relay_;
  std::shared_ptr<const mesh::CastTable> table_;
};

}  // namespace detail
}  // namespace castmesh
