// The public Communicator API: argument checks, collective numbering and
// signatures, and how a rank finds its group (current, along, split, dup).
#include "castmesh/communicator.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "core/actor/runtime_core.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/device_collectives.h"
#include "core/collectives/exchange.h"
#include "core/collectives/handles.h"
#include "core/progress/request_state.h"
#include "core/link/shm_ring_path.h"
#include "core/link/single_copy.h"
#include "core/platform/thread_cache.h"
#include "core/trace/recorder.h"
#include "core/mesh/mesh_directory.h"
#include "core/proc/proc_host.h"

namespace castmesh {

using collectives::CallSignature;
using collectives::Channel;
using collectives::CollectiveCall;
using detail::CommGroup;
using detail::RequestState;

// ---- ReduceSpec ----

absl::StatusOr<Reduction> ReduceSpec::on(DType dtype) const {
  if (custom_ != nullptr) {
    if (!custom_->fn) return absl::InvalidArgumentError(absl::StrCat("reduction '", custom_->name, "' has no function"));
    return Reduction::Custom(custom_->name, custom_->fn, custom_->commutative, dtype);
  }
  return Reduction::Builtin(builtin_, dtype);
}

std::string ReduceSpec::name() const {
  return custom_ != nullptr ? custom_->name : std::string(reduce_op_name(builtin_));
}

std::optional<ReduceOp> ReduceSpec::builtin() const {
  if (custom_ != nullptr) return std::nullopt;
  return builtin_;
}

// ---- Request ----

Request::Request() : state_(RequestState::Done(MessageStatus{})) {}

absl::StatusOr<MessageStatus> Request::wait(absl::Duration timeout) const {
  return device_ != nullptr ? device_->wait(timeout) : state_->wait(timeout);
}

std::optional<absl::StatusOr<MessageStatus>> Request::test() const {
  if (device_ != nullptr) device_->poll();
  return state_->test();
}

absl::Status Request::wait_stream(const DeviceStream& stream) const {
  if (device_ != nullptr) return device_->order_before(stream);
  absl::StatusOr<MessageStatus> result = state_->wait(absl::InfiniteDuration());
  return result.status();
}

absl::Status Request::wait_all(const std::vector<Request>& requests, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status first;
  for (const Request& r : requests) {
    absl::StatusOr<MessageStatus> result = r.wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!result.ok() && first.ok()) first = result.status();
  }
  return first;
}

absl::StatusOr<size_t> Request::wait_any(const std::vector<Request>& requests, absl::Duration timeout) {
  if (requests.empty()) return absl::InvalidArgumentError("wait_any on no requests");
  auto waiter = std::make_shared<detail::AnyWaiter>();
  for (const Request& r : requests) r.state_->add_waiter(waiter);
  {
    detail::MutexLock lock(waiter->mu);
    auto fired = [&waiter]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiter->mu) { return waiter->fired; };
    if (!waiter->cv.wait_for(lock, timeout, fired)) {
      return absl::DeadlineExceededError(
          absl::StrCat("none of ", requests.size(), " requests completed within ", absl::FormatDuration(timeout)));
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].state_->done()) return i;
  }
  return absl::InternalError("wait_any woke with no completed request");
}

// ---- finding the group ----

namespace {

std::weak_ptr<proc::ProcHost> host_of(Runtime* runtime) {
  if (runtime == nullptr) return {};
  return proc::ProcHost::of(*runtime);
}

std::string mesh_comm_id(const std::string& mesh_key) { return absl::StrCat("mesh:", mesh_key); }

// A mesh's communicators are kept alive between calls (every handler asks
// current() anew and must find the same sequence numbers); once the mesh is
// dropped from this process they go with their last handle, and with them
// any device communicator (NCCL's buffers, a stream) a collective made.
void unpin_communicators_of_dropped_meshes() {
  static const bool registered = [] {
    mesh::MeshDirectory::on_remove(
        [](const std::string& key) { collectives::Exchange::instance().unpin(mesh_comm_id(key)); });
    return true;
  }();
  (void)registered;
}

}  // namespace

absl::StatusOr<Communicator> Communicator::current() {
  detail::ActorCell* cell = detail::ActorCell::current();
  if (cell == nullptr) {
    return absl::FailedPreconditionError(
        "Communicator::current() is only available inside a handler of an actor mesh member");
  }
  const Address& self = cell->address();
  std::shared_ptr<const mesh::MeshMembership> membership = mesh::MeshDirectory::find(self);
  if (membership == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("actor ", self.to_string(), " is not a member of an actor mesh (no communicator)"));
  }
  auto rank = std::find(membership->members.begin(), membership->members.end(), self) - membership->members.begin();
  Runtime* runtime = Runtime::current();
  CommGroup::Layout layout;
  unpin_communicators_of_dropped_meshes();
  layout.id = mesh_comm_id(membership->key);
  layout.description = absl::StrCat("communicator of mesh '", membership->name, "'");
  layout.rank = static_cast<int>(rank);
  layout.shape = membership->base;
  for (const Address& m : membership->members) layout.procs.push_back(m.proc);
  layout.self_proc = self.proc;
  layout.host = host_of(runtime);
  return Communicator(CommGroup::Get(std::move(layout), /*pin=*/true));
}

Communicator::Communicator(std::shared_ptr<CommGroup> group) : group_(CommGroup::user_handle(std::move(group))) {}

int Communicator::rank() const { return group_->rank(); }
int Communicator::size() const { return group_->size(); }
const Shape& Communicator::shape() const { return group_->shape(); }
const std::string& Communicator::id() const { return group_->id(); }

absl::StatusOr<Communicator> Communicator::along(const std::vector<std::string>& dims) const {
  const Shape& shape = group_->shape();
  std::vector<bool> kept(shape.ndim(), false);
  for (const std::string& dim : dims) {
    absl::StatusOr<size_t> d = shape.dim(dim);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("along: ", d.status().message()));
    kept[*d] = true;
  }
  absl::StatusOr<Point> me = shape.point_at(static_cast<size_t>(rank()));
  if (!me.ok()) return me.status();
  // The peers: every point that agrees with this rank off the kept dimensions.
  std::vector<std::string> fixed;
  std::vector<std::pair<std::string, size_t>> sub_dims;
  for (size_t d = 0; d < shape.ndim(); ++d) {
    if (kept[d]) {
      sub_dims.emplace_back(shape.labels()[d], shape.sizes()[d]);
    } else {
      fixed.push_back(absl::StrCat(shape.labels()[d], "=", me->coords()[d]));
    }
  }
  CommGroup::Layout layout = group_->layout();
  layout.procs.clear();
  for (const Point& p : shape.points()) {
    bool peer = true;
    for (size_t d = 0; d < shape.ndim() && peer; ++d) peer = kept[d] || p.coords()[d] == me->coords()[d];
    if (!peer) continue;
    if (p.position() == static_cast<size_t>(rank())) layout.rank = static_cast<int>(layout.procs.size());
    layout.procs.push_back(group_->layout().procs[p.position()]);
  }
  absl::StatusOr<Shape> sub = Shape::Create(sub_dims);
  if (!sub.ok()) return sub.status();
  layout.id = absl::StrCat(group_->id(), "/along(", absl::StrJoin(fixed, ","), ")");
  layout.shape = *std::move(sub);
  return Communicator(CommGroup::Get(std::move(layout), /*pin=*/true));
}

// ---- argument checks and collective calls ----

namespace {

// A buffer the CPU algorithms can use: host memory, contiguous, and
// writable where it is written.
absl::Status check_buffer(const TensorView& t, absl::string_view what, bool written) {
  if (t.numel() == 0) return absl::OkStatus();
  if (!t.device().is_cpu()) return collectives::host_only(t, what, "this call");
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not contiguous (", t.to_string(), ")"));
  }
  if (written && t.read_only()) return absl::InvalidArgumentError(absl::StrCat(what, " is read-only"));
  return absl::OkStatus();
}

absl::Status check_same_dtype(const TensorView& in, const TensorView& out) {
  if (in.dtype() == out.dtype()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("input is ", std::string(dtype_name(in.dtype())), " but output is ",
                                                 std::string(dtype_name(out.dtype()))));
}

absl::Status check_root(int root, int size) {
  if (root >= 0 && root < size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank (0..", size - 1, ")"));
}

absl::Status check_elements(const TensorView& t, absl::string_view what, size_t expected) {
  if (static_cast<size_t>(t.numel()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has ", t.numel(), " elements, expected ", expected));
}

std::string format_signature(absl::string_view name, absl::string_view op, DType dtype, size_t count, int root) {
  const std::string_view type = dtype_name(dtype);
  const absl::string_view t(type.data(), type.size());
  if (op.empty()) {
    if (root >= 0) return absl::StrCat(name, "(", t, ", count=", count, ", root=", root, ")");
    return absl::StrCat(name, "(", t, ", count=", count, ")");
  }
  if (root >= 0) return absl::StrCat(name, "(", op, ", ", t, ", count=", count, ", root=", root, ")");
  return absl::StrCat(name, "(", op, ", ", t, ", count=", count, ")");
}

// The last signature this thread formatted: a loop of the same call (the
// usual case) formats it once.
struct LastSignature {
  std::string name, op;
  DType dtype = DType::kInt8;
  size_t count = 0;
  int root = -1;
  CallSignature formatted;
};

// Every collective call has one, so it is on the small-message latency path:
// a repeated call shares the last one (no formatting, no allocation).
CallSignature signature(absl::string_view name, absl::string_view op, DType dtype, size_t count, int root = -1) {
  LastSignature* last = platform::ThreadCache<LastSignature>::get();
  if (last == nullptr) return std::make_shared<const std::string>(format_signature(name, op, dtype, count, root));
  if (last->formatted == nullptr || last->dtype != dtype || last->count != count || last->root != root ||
      last->name != name || last->op != op) {
    last->name.assign(name.data(), name.size());
    last->op.assign(op.data(), op.size());
    last->dtype = dtype;
    last->count = count;
    last->root = root;
    last->formatted = std::make_shared<const std::string>(format_signature(name, op, dtype, count, root));
  }
  return last->formatted;
}

// One collective: numbered now (the same number on every rank), checked,
// then run. A failure on any rank fails it on every rank.
using Body = std::function<absl::Status(const CollectiveCall&)>;

// A signature's collective kind (metrics::collective_kind) and the bytes of
// user data it names (count x the element's size), parsed once per
// signature object: a loop of the same call shares one (signature() above).
struct SignatureShape {
  CallSignature sig;  // held: its address is not reused while it is the key
  size_t kind = 0;
  uint64_t bytes = 0;
};

void parse_shape(const CallSignature& sig, SignatureShape& last) {
  last.sig = sig;
  const std::string_view text = *sig;
  const size_t open = text.find('(');
  last.kind = metrics::collective_kind(text.substr(0, open));
  last.bytes = 0;
  // "name([op, ]dtype, count=N[, root=R])": the element type is the part before "count=".
  const size_t count_at = text.find("count=");
  if (open != std::string_view::npos && count_at != std::string_view::npos && count_at >= open + 3) {
    const std::string_view before = text.substr(open + 1, count_at - 2 - (open + 1));  // without ", "
    const size_t comma = before.rfind(", ");
    const std::string_view type = comma == std::string_view::npos ? before : before.substr(comma + 2);
    uint64_t count = 0;
    for (size_t i = count_at + 6; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      count = count * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    if (std::optional<DType> dtype = dtype_from_name(type)) last.bytes = count * dtype_size(*dtype);
  }
}

void count_call(CommGroup& group, const CallSignature& sig) {
  SignatureShape* last = platform::ThreadCache<SignatureShape>::get();
  if (last == nullptr) {  // this thread's caches are gone (the exit barrier)
    SignatureShape once;
    parse_shape(sig, once);
    group.counters().on_call(once.kind, once.bytes);
    return;
  }
  if (last->sig != sig) parse_shape(sig, *last);
  group.counters().on_call(last->kind, last->bytes);
}

CollectiveCall begin(CommGroup& group, CallSignature sig) {
  count_call(group, sig);
  return CollectiveCall{&group, group.next_sequence(), std::move(sig)};
}

absl::Status finish(const CollectiveCall& call, absl::Status st) {
  if (!st.ok()) call.group->abort(call.sequence, st);
  return st;
}

// While a trace records, a collective's run is a slice named by the
// collective ("allreduce"), its signature as detail and its number (the same
// on every rank, to find one call across ranks) as value.
class TracedCall {
 public:
  explicit TracedCall(const CollectiveCall& call) : call_(call), start_ns_(trace::on() ? trace::now_ns() : 0) {}
  ~TracedCall() {
    if (start_ns_ == 0) return;
    const std::string& sig = *call_.signature;
    const std::string_view name = std::string_view(sig).substr(0, sig.find('('));
    trace::slice(trace::Category::kCollective, trace::intern_cached(name), start_ns_, trace::now_ns(), call_.sequence,
                 trace::intern_cached(sig));
  }
  TracedCall(const TracedCall&) = delete;
  TracedCall& operator=(const TracedCall&) = delete;

 private:
  const CollectiveCall& call_;
  const int64_t start_ns_;
};

// A template rather than a Body: a blocking call's lambda (captures by
// reference) then costs no std::function allocation.
template <typename F>
absl::Status run_blocking(CommGroup& group, CallSignature sig, const absl::Status& checked, const F& body) {
  CollectiveCall call = begin(group, std::move(sig));
  const TracedCall traced(call);
  return finish(call, checked.ok() ? body(call) : checked);
}

Request run_nonblocking(CommGroup& group, CallSignature sig, const absl::Status& checked, Body body) {
  CollectiveCall call = begin(group, std::move(sig));
  if (!checked.ok()) return collectives_internal::Handles::request(RequestState::Done(finish(call, checked)));
  return group.run_async([call, body = std::move(body)] {
    const TracedCall traced(call);
    return finish(call, body(call));
  });
}

// What a reduction call needs after its checks.
struct ReductionArgs {
  absl::Status checked;
  std::optional<Reduction> op;
};

ReductionArgs check_reduction(const TensorView& in, const TensorView& out, const ReduceSpec& spec, bool out_used,
                              size_t out_factor) {
  ReductionArgs args;
  args.checked = check_buffer(in, "input", false);
  if (args.checked.ok() && out_used) args.checked = check_buffer(out, "output", true);
  if (args.checked.ok() && out_used) args.checked = check_same_dtype(in, out);
  if (args.checked.ok() && out_used) args.checked = check_elements(in, "input", out.numel() * out_factor);
  if (!args.checked.ok()) return args;
  absl::StatusOr<Reduction> op = spec.on(in.dtype());
  if (op.ok()) {
    args.op = *std::move(op);
  } else {
    args.checked = op.status();
  }
  return args;
}

}  // namespace

// ---- split / dup ----

absl::StatusOr<std::optional<Communicator>> Communicator::split(int color, int key) const {
  const int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<size_t>(size()));
  uint64_t sequence = 0;
  absl::Status st = run_blocking(*group_, signature("split", "", DType::kInt32, 2), absl::OkStatus(),
                                 [&](const CollectiveCall& call) {
                                   sequence = call.sequence;
                                   return collectives::run_allgather(call, mine, all.data(), sizeof(mine));
                                 });
  if (!st.ok()) return st;
  if (color == kUndefined) return std::optional<Communicator>();
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] == color) ranks.push_back(r);
  }
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  CommGroup::Layout layout = group_->layout();
  layout.procs.clear();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank()) layout.rank = static_cast<int>(i);
    layout.procs.push_back(group_->layout().procs[ranks[i]]);
  }
  // Every member of the new group saw the same allgather: same sequence, same id.
  layout.id = absl::StrCat(group_->id(), "/split", sequence, ":", color);
  absl::StatusOr<Shape> shape = Shape::Create({{"ranks", ranks.size()}});
  if (!shape.ok()) return shape.status();
  layout.shape = *std::move(shape);
  return std::optional<Communicator>(Communicator(CommGroup::Get(std::move(layout), /*pin=*/false)));
}

absl::StatusOr<Communicator> Communicator::dup() const {
  uint64_t sequence = 0;
  auto sig = std::make_shared<const std::string>("dup()");
  absl::Status st = run_blocking(*group_, std::move(sig), absl::OkStatus(), [&](const CollectiveCall& call) {
    sequence = call.sequence;
    return collectives::run_barrier(call);
  });
  if (!st.ok()) return st;
  CommGroup::Layout layout = group_->layout();
  layout.id = absl::StrCat(group_->id(), "/dup", sequence);
  return Communicator(CommGroup::Get(std::move(layout), /*pin=*/false));
}

// ---- point to point ----

absl::Status Communicator::send(const TensorView& data, int dest, int tag) const {
  if (absl::Status st = check_buffer(data, "send buffer", false); !st.ok()) return st;
  if (tag < 0) return absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is negative"));
  return group_->send(Channel::kP2P, dest, tag, data.data(), data.nbytes());
}

Request Communicator::isend(const TensorView& data, int dest, int tag) const {
  if (absl::Status st = check_buffer(data, "send buffer", false); !st.ok()) return Request(RequestState::Done(st));
  if (tag < 0) return Request(RequestState::Done(absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is negative"))));
  return Request(group_->start_send(Channel::kP2P, dest, tag, data.data(), data.nbytes()));
}

Request Communicator::irecv(const TensorView& out, int source, int tag) const {
  if (absl::Status st = check_buffer(out, "receive buffer", true); !st.ok()) return Request(RequestState::Done(st));
  if (tag < 0 && tag != kAnyTag) {
    return Request(RequestState::Done(absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is negative"))));
  }
  return Request(group_->post_recv(Channel::kP2P, source, tag, out.data(), out.nbytes()));
}

absl::StatusOr<MessageStatus> Communicator::recv(const TensorView& out, int source, int tag,
                                                 absl::Duration timeout) const {
  if (absl::Status st = check_buffer(out, "receive buffer", true); !st.ok()) return st;
  if (tag < 0 && tag != kAnyTag) return absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is negative"));
  std::shared_ptr<RequestState> request = group_->post_recv(Channel::kP2P, source, tag, out.data(), out.nbytes());
  absl::StatusOr<MessageStatus> result = request->wait(timeout);
  // Timed out: withdraw the receive so no byte lands in `out` afterwards
  // (unless a message matched it meanwhile; then that result stands).
  if (absl::IsDeadlineExceeded(result.status()) && !group_->mailbox().cancel(request)) {
    return request->wait(absl::InfiniteDuration());
  }
  return result;
}

absl::StatusOr<MessageStatus> Communicator::probe(int source, int tag, absl::Duration timeout) const {
  return group_->mailbox().probe(source, tag, timeout);
}

std::optional<MessageStatus> Communicator::iprobe(int source, int tag) const {
  absl::StatusOr<MessageStatus> found = group_->mailbox().probe(source, tag, absl::ZeroDuration());
  if (!found.ok()) return std::nullopt;
  return *found;
}

// ---- collectives ----

namespace {
// Made once and never destroyed: the exit barrier runs from an atexit handler.
const CallSignature& barrier_signature() {
  static const auto* sig = new CallSignature(std::make_shared<const std::string>("barrier()"));
  return *sig;
}
}  // namespace

absl::Status Communicator::barrier() const {
  return run_blocking(*group_, barrier_signature(), absl::OkStatus(), collectives::run_barrier);
}
Request Communicator::ibarrier() const {
  return run_nonblocking(*group_, barrier_signature(), absl::OkStatus(), collectives::run_barrier);
}

namespace {

// A collective after its checks: what it is called on the wire, whether the
// arguments are fine, and the algorithm to run.
struct Prepared {
  CallSignature sig;
  absl::Status checked;
  Body body;
};

Prepared with_reduction(CallSignature sig, ReductionArgs args,
                        std::function<absl::Status(const CollectiveCall&, const Reduction&)> run) {
  Prepared p{std::move(sig), args.checked, nullptr};
  if (args.op) p.body = [op = *args.op, run = std::move(run)](const CollectiveCall& call) { return run(call, op); };
  return p;
}

Prepared prepare_allreduce(const TensorView& in, const TensorView& out, const ReduceSpec& spec) {
  const size_t n = static_cast<size_t>(in.numel());
  return with_reduction(signature("allreduce", spec.name(), in.dtype(), n), check_reduction(in, out, spec, true, 1),
                        [in, out, n](const CollectiveCall& call, const Reduction& op) {
                          return collectives::run_allreduce(call, in.data(), out.data(), n, op);
                        });
}

Prepared prepare_reduce(const TensorView& in, const TensorView& out, const ReduceSpec& spec, int root, int rank,
                        int size) {
  const size_t n = static_cast<size_t>(in.numel());
  ReductionArgs args = check_reduction(in, out, spec, rank == root, 1);
  if (args.checked.ok()) args.checked = check_root(root, size);
  return with_reduction(signature("reduce", spec.name(), in.dtype(), n, root), std::move(args),
                        [in, out, n, root](const CollectiveCall& call, const Reduction& op) {
                          return collectives::run_reduce(call, in.data(), out.data(), n, op, root);
                        });
}

Prepared prepare_broadcast(const TensorView& data, int root, int rank, int size) {
  absl::Status checked = check_buffer(data, "buffer", rank != root);
  if (checked.ok()) checked = check_root(root, size);
  return {signature("broadcast", "", data.dtype(), static_cast<size_t>(data.numel()), root), checked,
          [data, root](const CollectiveCall& call) {
            return collectives::run_broadcast(call, data.data(), data.nbytes(), root);
          }};
}

// allgather and gather: `out` (where used) holds size x in.
Prepared prepare_gathering(absl::string_view name, const TensorView& in, const TensorView& out, bool out_used,
                           int size, std::function<absl::Status(const CollectiveCall&)> body, int root = -1) {
  absl::Status checked = check_buffer(in, "input", false);
  if (checked.ok() && out_used) checked = check_buffer(out, "output", true);
  if (checked.ok() && out_used) checked = check_same_dtype(in, out);
  if (checked.ok() && out_used) checked = check_elements(out, "output", static_cast<size_t>(in.numel()) * size);
  if (checked.ok() && root >= 0) checked = check_root(root, size);
  return {signature(name, "", in.dtype(), static_cast<size_t>(in.numel()), root), checked, std::move(body)};
}

}  // namespace

absl::Status Communicator::allreduce(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                                     const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_allreduce(*group_, in, out, op, device).wait().status();
  }
  // Not through prepare_allreduce: no TensorView copies or std::function
  // on the blocking path (small allreduces are latency-bound).
  const size_t n = static_cast<size_t>(in.numel());
  const ReductionArgs args = check_reduction(in, out, op, true, 1);
  return run_blocking(*group_, signature("allreduce", op.name(), in.dtype(), n), args.checked,
                      [&](const CollectiveCall& call) {
                        return collectives::run_allreduce(call, in.data(), out.data(), n, *args.op);
                      });
}
Request Communicator::iallreduce(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                                 const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_allreduce(*group_, in, out, op, device);
  Prepared p = prepare_allreduce(in, out, op);
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}

absl::Status Communicator::reduce(const TensorView& in, const TensorView& out, const ReduceSpec& op, int root,
                                  const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_reduce(*group_, in, out, op, root, device).wait().status();
  }
  Prepared p = prepare_reduce(in, out, op, root, rank(), size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::ireduce(const TensorView& in, const TensorView& out, const ReduceSpec& op, int root,
                              const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_reduce(*group_, in, out, op, root, device);
  Prepared p = prepare_reduce(in, out, op, root, rank(), size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}

absl::Status Communicator::broadcast(const TensorView& data, int root, const DeviceOptions& device) const {
  if (collectives::on_device(data, data)) {
    return collectives::device_broadcast(*group_, data, root, device).wait().status();
  }
  Prepared p = prepare_broadcast(data, root, rank(), size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::ibroadcast(const TensorView& data, int root, const DeviceOptions& device) const {
  if (collectives::on_device(data, data)) return collectives::device_broadcast(*group_, data, root, device);
  Prepared p = prepare_broadcast(data, root, rank(), size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}

namespace {
Prepared prepare_allgather(const TensorView& in, const TensorView& out, int size) {
  return prepare_gathering("allgather", in, out, true, size, [in, out](const CollectiveCall& call) {
    return collectives::run_allgather(call, in.data(), out.data(), in.nbytes());
  });
}
Prepared prepare_gather(const TensorView& in, const TensorView& out, int root, int rank, int size) {
  return prepare_gathering(
      "gather", in, out, rank == root, size,
      [in, out, root](const CollectiveCall& call) {
        return collectives::run_gather(call, in.data(), out.data(), in.nbytes(), root);
      },
      root);
}
// scatter: root's `in` holds size x out.
Prepared prepare_scatter(const TensorView& in, const TensorView& out, int root, int rank, int size) {
  absl::Status checked = check_buffer(out, "output", true);
  if (checked.ok()) checked = check_root(root, size);
  if (checked.ok() && rank == root) checked = check_buffer(in, "input", false);
  if (checked.ok() && rank == root) checked = check_same_dtype(in, out);
  if (checked.ok() && rank == root) checked = check_elements(in, "input", static_cast<size_t>(out.numel()) * size);
  return {signature("scatter", "", out.dtype(), static_cast<size_t>(out.numel()), root), checked,
          [in, out, root](const CollectiveCall& call) {
            return collectives::run_scatter(call, in.data(), out.data(), out.nbytes(), root);
          }};
}
Prepared prepare_reduce_scatter(const TensorView& in, const TensorView& out, const ReduceSpec& spec, int size) {
  const size_t n = static_cast<size_t>(out.numel());
  return with_reduction(signature("reduce_scatter", spec.name(), out.dtype(), n),
                        check_reduction(in, out, spec, true, static_cast<size_t>(size)),
                        [in, out, n](const CollectiveCall& call, const Reduction& op) {
                          return collectives::run_reduce_scatter(call, in.data(), out.data(), n, op);
                        });
}
Prepared prepare_alltoall(const TensorView& in, const TensorView& out, int size) {
  absl::Status checked = check_buffer(in, "input", false);
  if (checked.ok()) checked = check_buffer(out, "output", true);
  if (checked.ok()) checked = check_same_dtype(in, out);
  if (checked.ok()) checked = check_elements(out, "output", static_cast<size_t>(in.numel()));
  if (checked.ok() && in.numel() % size != 0) {
    checked = absl::InvalidArgumentError(absl::StrCat("alltoall input of ", in.numel(),
                                                      " elements is not divisible into ", size, " blocks"));
  }
  const size_t block = checked.ok() ? in.nbytes() / size : 0;
  return {signature("alltoall", "", in.dtype(), static_cast<size_t>(in.numel())), checked,
          [in, out, block](const CollectiveCall& call) {
            // In place: the input must survive while blocks land in `out`.
            if (in.data() == out.data()) {
              std::vector<char> copy(static_cast<const char*>(in.data()), static_cast<const char*>(in.data()) + in.nbytes());
              return collectives::run_alltoall(call, copy.data(), out.data(), block);
            }
            return collectives::run_alltoall(call, in.data(), out.data(), block);
          }};
}
}  // namespace

absl::Status Communicator::allgather(const TensorView& in, const TensorView& out, const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_allgather(*group_, in, out, device).wait().status();
  }
  Prepared p = prepare_allgather(in, out, size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::iallgather(const TensorView& in, const TensorView& out, const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_allgather(*group_, in, out, device);
  Prepared p = prepare_allgather(in, out, size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}
absl::Status Communicator::gather(const TensorView& in, const TensorView& out, int root,
                                  const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_gather(*group_, in, out, root, device).wait().status();
  }
  Prepared p = prepare_gather(in, out, root, rank(), size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::igather(const TensorView& in, const TensorView& out, int root,
                              const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_gather(*group_, in, out, root, device);
  Prepared p = prepare_gather(in, out, root, rank(), size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}
absl::Status Communicator::scatter(const TensorView& in, const TensorView& out, int root,
                                   const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_scatter(*group_, in, out, root, device).wait().status();
  }
  Prepared p = prepare_scatter(in, out, root, rank(), size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::iscatter(const TensorView& in, const TensorView& out, int root,
                               const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_scatter(*group_, in, out, root, device);
  Prepared p = prepare_scatter(in, out, root, rank(), size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}
absl::Status Communicator::reduce_scatter(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                                          const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_reduce_scatter(*group_, in, out, op, device).wait().status();
  }
  Prepared p = prepare_reduce_scatter(in, out, op, size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::ireduce_scatter(const TensorView& in, const TensorView& out, const ReduceSpec& op,
                                      const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_reduce_scatter(*group_, in, out, op, device);
  Prepared p = prepare_reduce_scatter(in, out, op, size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}
absl::Status Communicator::alltoall(const TensorView& in, const TensorView& out, const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) {
    return collectives::device_alltoall(*group_, in, out, device).wait().status();
  }
  Prepared p = prepare_alltoall(in, out, size());
  return run_blocking(*group_, p.sig, p.checked, p.body);
}
Request Communicator::ialltoall(const TensorView& in, const TensorView& out, const DeviceOptions& device) const {
  if (collectives::on_device(in, out)) return collectives::device_alltoall(*group_, in, out, device);
  Prepared p = prepare_alltoall(in, out, size());
  return run_nonblocking(*group_, p.sig, p.checked, p.body);
}

DataPathBytes data_path_bytes() {
  const link::ShmPathStats shm = link::shm_path_stats();
  return DataPathBytes{shm.shm_bytes_out, link::single_copy_bytes(), shm.socket_bytes_out};
}

}  // namespace castmesh
