#include "core/collectives/algorithms.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/platform/thread_cache.h"
#include "core/link/selector.h"

namespace castmesh::collectives {
namespace {

// The steps of one collective on this rank: tagged sends and receives.
class Steps {
 public:
  explicit Steps(const CollectiveCall& call)
      : call_(call), rank_(call.group->rank()), size_(call.group->size()) {}
  int rank() const { return rank_; }
  int size() const { return size_; }

  absl::Status send(int dest, uint32_t step, const void* data, size_t bytes) const {
    return call_.group->send(Channel::kCollective, dest, collective_tag(call_.sequence, step), data, bytes,
                             *call_.signature, call_.sequence);
  }
  // A send that may still be in flight (single copy: until the receiver read it).
  std::shared_ptr<detail::RequestState> start_send(int dest, uint32_t step, const void* data, size_t bytes) const {
    return call_.group->start_send(Channel::kCollective, dest, collective_tag(call_.sequence, step), data, bytes,
                                   *call_.signature, call_.sequence);
  }
  std::shared_ptr<detail::RequestState> post(int source, uint32_t step, void* data, size_t bytes) const {
    return call_.group->post_recv(Channel::kCollective, source, collective_tag(call_.sequence, step), data, bytes,
                                  call_.signature);
  }
  static absl::Status wait(const std::shared_ptr<detail::RequestState>& request) {
    return request->wait(absl::InfiniteDuration()).status();
  }
  // Waits for every request; the first error, else OK.
  static absl::Status wait_all(const std::vector<std::shared_ptr<detail::RequestState>>& requests) {
    absl::Status first;
    for (const auto& request : requests) {
      if (absl::Status st = wait(request); !st.ok() && first.ok()) first = st;
    }
    return first;
  }
  absl::Status recv(int source, uint32_t step, void* data, size_t bytes) const {
    return wait(post(source, step, data, bytes));
  }
  // Receive from `source` while sending to `dest` (receive posted first).
  absl::Status exchange(int dest, const void* out, size_t out_bytes, int source, void* in, size_t in_bytes,
                        uint32_t step) const {
    auto received = post(source, step, in, in_bytes);
    if (absl::Status st = send(dest, step, out, out_bytes); !st.ok()) return st;
    return wait(received);
  }

 private:
  const CollectiveCall& call_;
  const int rank_;
  const int size_;
};

#define CASTMESH_RETURN_IF_ERROR(expr)      \
  do {                                      \
    if (absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }
const char* at(const void* base, size_t offset) { return static_cast<const char*>(base) + offset; }

// Element range [begin, end) of block `b` when `count` is cut into `parts`.
std::pair<size_t, size_t> block_range(size_t count, int parts, int b) {
  const size_t base = count / parts, extra = count % parts;
  const size_t ub = static_cast<size_t>(b);
  const size_t begin = ub * base + std::min(ub, extra);
  return {begin, begin + base + (ub < extra ? 1 : 0)};
}

int mod(int a, int n) { return ((a % n) + n) % n; }

absl::Status binomial_broadcast(const Steps& s, void* data, size_t bytes, int root) {
  const int p = s.size(), vr = mod(s.rank() - root, p);
  int mask = 1;
  while (mask < p) {
    if (vr & mask) {
      CASTMESH_RETURN_IF_ERROR(s.recv(mod(vr - mask + root, p), 0, data, bytes));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < p) CASTMESH_RETURN_IF_ERROR(s.send(mod(vr + mask + root, p), 0, data, bytes));
  }
  return absl::OkStatus();
}

// A chain root -> root+1 -> ...: segment i is forwarded as soon as it
// arrives, so the chain streams at link speed once full.
absl::Status chain_broadcast(const Steps& s, void* data, size_t bytes, int root) {
  const int p = s.size(), vr = mod(s.rank() - root, p);
  const size_t segments = (bytes + kPipelineSegmentBytes - 1) / kPipelineSegmentBytes;
  const int prev = mod(s.rank() - 1, p), next = mod(s.rank() + 1, p);
  std::vector<std::shared_ptr<detail::RequestState>> incoming;
  if (vr != 0) {
    for (size_t i = 0; i < segments; ++i) {
      const size_t off = i * kPipelineSegmentBytes;
      incoming.push_back(s.post(prev, static_cast<uint32_t>(i), at(data, off), std::min(kPipelineSegmentBytes, bytes - off)));
    }
  }
  for (size_t i = 0; i < segments; ++i) {
    const size_t off = i * kPipelineSegmentBytes, len = std::min(kPipelineSegmentBytes, bytes - off);
    if (vr != 0) CASTMESH_RETURN_IF_ERROR(Steps::wait(incoming[i]));
    if (vr != p - 1) CASTMESH_RETURN_IF_ERROR(s.send(next, static_cast<uint32_t>(i), at(data, off), len));
  }
  return absl::OkStatus();
}

struct ScratchBuffer {
  std::vector<char> bytes;
};

// Recursive doubling over the ranks; non-powers of two fold their extra
// ranks into neighbours first. Partners combine (lower, higher), so both
// compute the same bits.
absl::Status recursive_doubling_allreduce(const Steps& s, void* out, size_t count, const Reduction& op) {
  const size_t bytes = count * dtype_size(op.dtype());
  const int p = s.size(), r = s.rank();
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  const int rem = p - p2;
  // Small ones reuse this thread's buffer (no allocation, no zeroing per
  // call: they are latency-bound). Nothing else on the thread uses it
  // meanwhile (a collective runs to its end on its thread).
  ScratchBuffer* scratch = bytes <= kSmallMessageBytes ? platform::ThreadCache<ScratchBuffer>::get() : nullptr;
  std::vector<char> own;
  std::vector<char>& tmp = scratch != nullptr ? scratch->bytes : own;
  if (tmp.size() < bytes) tmp.resize(bytes);
  int vr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      CASTMESH_RETURN_IF_ERROR(s.send(r + 1, 0, out, bytes));
      vr = -1;
    } else {
      CASTMESH_RETURN_IF_ERROR(s.recv(r - 1, 0, tmp.data(), bytes));
      op.combine3(tmp.data(), out, out, count);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    uint32_t step = 1;
    for (int mask = 1; mask < p2; mask <<= 1, ++step) {
      const int vpartner = vr ^ mask;
      const int partner = vpartner < rem ? vpartner * 2 + 1 : vpartner + rem;
      CASTMESH_RETURN_IF_ERROR(s.exchange(partner, out, bytes, partner, tmp.data(), bytes, step));
      if (vpartner < vr) {
        op.combine3(tmp.data(), out, out, count);
      } else {
        op.combine3(out, tmp.data(), out, count);
      }
    }
  }
  if (r < 2 * rem) {
    constexpr uint32_t kResultStep = 0xfffff;
    if (r % 2 == 1) return s.send(r - 1, kResultStep, out, bytes);
    return s.recv(r + 1, kResultStep, out, bytes);
  }
  return absl::OkStatus();
}

// The segments of one pipelined ring allreduce: every block is cut into
// `segments` pieces; piece j of block b is block_range(block, segments, j)
// within it. Tag steps: (phase step) * segments + j.
struct SegmentPlan {
  size_t count = 0;
  int parts = 0;
  size_t segments = 1;
  // Element range [begin, end) of segment j of block b.
  std::pair<size_t, size_t> range(int b, size_t j) const {
    auto [bb, be] = block_range(count, parts, b);
    auto [sb, se] = block_range(be - bb, static_cast<int>(segments), static_cast<int>(j));
    return {bb + sb, bb + se};
  }
  uint32_t step(int phase_step, size_t j) const {
    return static_cast<uint32_t>(static_cast<size_t>(phase_step) * segments + j);
  }
};

SegmentPlan plan_segments(size_t count, int p, size_t item) {
  SegmentPlan plan{count, p, 1};
  const size_t smallest_block = count / static_cast<size_t>(p);
  const size_t block_bytes = (smallest_block + 1) * item;
  plan.segments = std::max<size_t>(1, (block_bytes + kAllreduceSegmentBytes - 1) / kAllreduceSegmentBytes);
  // Every segment at least one element, and every tag step within 24 bits.
  const size_t max_segments = std::max<size_t>(1, 0xfff000 / (2 * static_cast<size_t>(p)));
  plan.segments = std::min({plan.segments, std::max<size_t>(1, smallest_block), max_segments});
  return plan;
}

// Whether an early return must wait for sends on a link with `caps`: a
// send that holds its buffer until the link is done with it (a socket send:
// until the transport wrote it, or lost the connection, which ends it too)
// is waited for; one that waits for its receive is abandoned instead (a
// peer that aborted the collective never answers it; it reads nothing more
// either).
bool sends_hold_buffers(const link::Capabilities& caps) {
  return caps.send_holds_buffer && !caps.send_waits_for_receive;
}

// Sends of one collective that may still read their buffers.
class SendsInFlight {
 public:
  // All go to rank `dest` of `group`. `wait_on_unwind`: an early return
  // waits for every send still pending.
  SendsInFlight(detail::CommGroup* group, int dest, bool wait_on_unwind)
      : group_(group), dest_(dest), wait_on_unwind_(wait_on_unwind) {}
  ~SendsInFlight() {
    for (const auto& request : requests_) {
      if (wait_on_unwind_) {
        (void)request->wait(absl::InfiniteDuration());
      } else {
        // A send waiting for its receive: the peer may still match it and,
        // when its read fails, ask for the bytes; they must not be read from
        // buffers freed after this returns (a crash, seen in
        // RankKilledMidAllreduce tests).
        group_->abandon_send(request);
      }
    }
  }
  void add(std::shared_ptr<detail::RequestState> request) { requests_.push_back(std::move(request)); }
  // The error of a send that already failed, or of the destination rank
  // being gone (a socket send that the transport dropped completes), else OK.
  absl::Status first_failure() const {
    if (absl::Status gone = group_->mailbox().source_error(dest_); !gone.ok()) return gone;
    for (const auto& request : requests_) {
      if (!request->done()) continue;
      if (auto result = request->test(); result && !result->ok()) return result->status();
    }
    return absl::OkStatus();
  }
  // Waits for one of these sends to be read. Ends early, with the error,
  // when the destination is gone or collective `sequence` was aborted (a
  // peer that left the collective may never read it).
  absl::Status wait_read(const std::shared_ptr<detail::RequestState>& request, uint64_t sequence) const {
    constexpr absl::Duration kLookAround = absl::Milliseconds(20);
    while (!request->wait(kLookAround).ok() && !request->done()) {
      if (absl::Status failed = first_failure(); !failed.ok()) return failed;
      if (absl::Status aborted = group_->mailbox().collective_error(sequence); !aborted.ok()) return aborted;
    }
    return Steps::wait(request);  // complete: returns at once
  }
  // Waits for every send: the first error, else OK.
  absl::Status wait_all() {
    absl::Status st = Steps::wait_all(requests_);
    requests_.clear();
    return st;
  }

 private:
  detail::CommGroup* const group_;
  const int dest_;
  const bool wait_on_unwind_;
  std::vector<std::shared_ptr<detail::RequestState>> requests_;
};

// Receives of one collective still posted: on an early return they are
// withdrawn (or, when a delivery already took them, waited for), so no byte
// lands in scratch or output memory after the call returned.
class PostedReceives {
 public:
  explicit PostedReceives(detail::CommGroup* group) : group_(group) {}
  ~PostedReceives() {
    for (auto& request : requests_) {
      if (request == nullptr || request->done()) continue;
      if (!group_->mailbox().cancel(request)) (void)request->wait(absl::InfiniteDuration());
    }
  }
  void add(size_t index, std::shared_ptr<detail::RequestState> request) {
    if (requests_.size() <= index) requests_.resize(index + 1);
    requests_[index] = std::move(request);
  }
  // Waits for receive `index` and forgets it. A send of the same
  // collective that fails meanwhile (its destination died) ends the wait
  // with that error: the receive may come from a live rank that has left
  // the collective over the same death, and would never complete.
  absl::Status wait(size_t index, const SendsInFlight& sends) {
    constexpr absl::Duration kLookAtSends = absl::Milliseconds(20);
    while (!requests_[index]->wait(kLookAtSends).ok() && !requests_[index]->done()) {
      if (absl::Status failed = sends.first_failure(); !failed.ok()) return failed;
    }
    absl::Status st = Steps::wait(requests_[index]);  // complete: returns at once
    if (st.ok()) requests_[index].reset();
    return st;
  }

 private:
  detail::CommGroup* group_;
  std::vector<std::shared_ptr<detail::RequestState>> requests_;
};

// Ring reduce-scatter then ring allgather, each block cut into segments
// (kAllreduceSegmentBytes) that flow along the ring one after another: a
// rank reduces segment k of a block while the next ones are in flight, and
// forwards it at once. A received segment lands in a small scratch ring that
// stays in cache and is combined with this rank's *input* straight into
// `out`, so the input is never copied to the output first and every byte of
// `out` is written once per phase. Sends of the first step read `in`, later
// ones `out`; the allgather receives go straight into `out`. `in` may be
// `out` (in place): a segment of `in` is overwritten only after the peer
// that reads it has combined it (causal along the ring).
//
// Operand order: the data of the lower-ranked neighbour goes on the left, so
// at p = 2 even non-commutative ops are exact (each half is combined once,
// rank 0's data on the left); for p > 2 the partial sums wrap around the
// ring and only commutative ops may take this path.
absl::Status pipelined_ring_allreduce(const Steps& s, const CollectiveCall& call, const void* in, void* out,
                                      size_t count, const Reduction& op) {
  const size_t item = dtype_size(op.dtype());
  const int p = s.size(), r = s.rank(), right = mod(r + 1, p), left = mod(r - 1, p);
  const SegmentPlan plan = plan_segments(count, p, item);
  const size_t nseg = plan.segments;
  const size_t slot_elems = (count / p + 1 + nseg - 1) / nseg + 1;
  // Sends that wait for their receive (single-copy offers) cost nothing
  // until it is posted, so a few receives ahead suffice; a body that
  // travels (socket, ring, a rank of this process) and finds no receive is
  // copied once more, so there a block's worth more is posted ahead. The
  // left neighbour's link to this rank is the mirror of this rank's to it.
  const bool offered = call.group->route(left, slot_elems * item).caps.send_waits_for_receive;
  const size_t reduce_total = static_cast<size_t>(p - 1) * nseg;
  // Travelling bodies: the whole first step arrives at once, later steps
  // about as fast as this rank consumes the one before.
  const size_t window = std::min<size_t>(offered ? kAllreduceWindow : nseg + kAllreduceWindow, reduce_total);
  // The scratch ring is the communicator's, kept between calls (scratch_pool.h says why).
  const ScratchPool::Lease scratch_lease = call.group->scratch().take(window * slot_elems * item);
  char* const scratch = scratch_lease.data();
  const bool received_on_left = left < r;

  SendsInFlight sends(call.group, right, sends_hold_buffers(call.group->route(right, slot_elems * item).caps));
  PostedReceives reduce_recvs(call.group), gather_recvs(call.group);
  // Every allgather receive lands in `out`, so that segments are read as
  // soon as they are offered. Allgather step st brings block r - st, which
  // this rank wrote in reduce step st - 1 and sent on in reduce step st: its
  // receive is posted right after that send (its final value can only come
  // round after it), so the thread that delivers it is ordered after this
  // rank's write and after a ring send's read of the block through the
  // mailbox, and not only through the other ranks. Block r, which this rank
  // never writes, is posted now.
  auto post_gather = [&](int st, size_t j) {
    auto [sb, se] = plan.range(mod(r - st, p), j);
    gather_recvs.add(st * nseg + j, s.post(left, plan.step(p - 1 + st, j), at(out, sb * item), (se - sb) * item));
  };
  for (size_t j = 0; j < nseg; ++j) post_gather(0, j);
  auto post_reduce = [&](size_t index) {
    const int st = static_cast<int>(index / nseg);
    const size_t j = index % nseg;
    auto [sb, se] = plan.range(mod(r - st - 1, p), j);
    reduce_recvs.add(index, s.post(left, plan.step(st, j), at(scratch, (index % window) * slot_elems * item),
                                   (se - sb) * item));
  };
  for (size_t i = 0; i < window; ++i) post_reduce(i);
  // Step 0 sends this rank's own block straight from the input.
  for (size_t j = 0; j < nseg; ++j) {
    auto [sb, se] = plan.range(r, j);
    sends.add(s.start_send(right, plan.step(0, j), at(in, sb * item), (se - sb) * item));
  }
  for (size_t index = 0; index < reduce_total; ++index) {
    const int st = static_cast<int>(index / nseg);
    const size_t j = index % nseg;
    auto [sb, se] = plan.range(mod(r - st - 1, p), j);
    CASTMESH_RETURN_IF_ERROR(reduce_recvs.wait(index, sends));
    const char* theirs = at(scratch, (index % window) * slot_elems * item);
    const char* mine = at(in, sb * item);
    char* dst = at(out, sb * item);
    if (received_on_left) {
      op.combine3(theirs, mine, dst, se - sb);
    } else {
      op.combine3(mine, theirs, dst, se - sb);
    }
    if (index + window < reduce_total) post_reduce(index + window);
    if (st < p - 2) {
      sends.add(s.start_send(right, plan.step(st + 1, j), dst, (se - sb) * item));
      post_gather(st + 1, j);
    } else {  // the segment is complete here: finish it and start it round the ring
      op.finalize(dst, se - sb, p);
      sends.add(s.start_send(right, plan.step(p - 1, j), dst, (se - sb) * item));
    }
  }
  for (int st = 0; st < p - 1; ++st) {
    const int b = mod(r - st, p);
    for (size_t j = 0; j < nseg; ++j) {
      CASTMESH_RETURN_IF_ERROR(gather_recvs.wait(st * nseg + j, sends));
      if (st < p - 2) {
        auto [sb, se] = plan.range(b, j);
        sends.add(s.start_send(right, plan.step(p + st, j), at(out, sb * item), (se - sb) * item));
      }
    }
  }
  return sends.wait_all();
}

// Two ranks, large messages: each rank reads the peer's whole input (in
// segments, all offered at once) and combines every segment itself, rank
// 0's data on the left, so both compute the same bits (non-commutative ops
// included). Against the ring's reduce-scatter + allgather this moves the
// same bytes and combines twice as many, but a rank never waits for its
// peer's arithmetic, only for its offers: the ring's allgather waits for the
// peer's reduced half, and on a loaded host each such wait risks a
// descheduled peer (measured in bench/RESULTS.md, issue 12, 1 MiB).
// Segments land in `out` and are combined there; in place (`in` == `out`)
// they land in a scratch ring, and segment k of `out` is written only
// after the peer has read segment k of `in` (its send completed).
// Steps start at 1, so a peer that runs another algorithm (a count
// mismatch across a threshold) matches a step and reports the mismatch.
absl::Status two_rank_exchange_allreduce(const Steps& s, const CollectiveCall& call, const void* in, void* out,
                                         size_t count, const Reduction& op) {
  const size_t item = dtype_size(op.dtype());
  const int peer = 1 - s.rank();
  const size_t max_segments = 0xfff000;
  const size_t nseg = std::clamp<size_t>((count * item + kAllreduceSegmentBytes - 1) / kAllreduceSegmentBytes, 1,
                                         std::min(count, max_segments));
  const SegmentPlan plan{count, 1, nseg};
  auto step = [](size_t j) { return static_cast<uint32_t>(j + 1); };
  const bool in_place = in == out;
  const link::Route route = call.group->route(peer, (count / nseg) * item);
  const bool offered = route.caps.send_waits_for_receive;
  // Offers wait for their receive at no cost, so a few posted ahead
  // suffice; a travelling body that finds none is copied once more.
  const size_t window = offered ? std::min(kAllreduceWindow, nseg) : nseg;
  const size_t slot_elems = count / nseg + 1;
  const ScratchPool::Lease scratch_lease = in_place ? call.group->scratch().take(window * slot_elems * item)
                                                    : ScratchPool::Lease();
  char* const scratch = scratch_lease.data();
  auto landing = [&](size_t j) {
    return in_place ? at(scratch, (j % window) * slot_elems * item) : at(out, plan.range(0, j).first * item);
  };
  SendsInFlight sends(call.group, peer, sends_hold_buffers(route.caps));
  std::vector<std::shared_ptr<detail::RequestState>> send_requests(nseg);
  PostedReceives recvs(call.group);
  auto post = [&](size_t j) {
    auto [sb, se] = plan.range(0, j);
    recvs.add(j, s.post(peer, step(j), landing(j), (se - sb) * item));
  };
  for (size_t j = 0; j < window; ++j) post(j);
  for (size_t j = 0; j < nseg; ++j) {
    auto [sb, se] = plan.range(0, j);
    send_requests[j] = s.start_send(peer, step(j), at(in, sb * item), (se - sb) * item);
    sends.add(send_requests[j]);
  }
  for (size_t j = 0; j < nseg; ++j) {
    auto [sb, se] = plan.range(0, j);
    CASTMESH_RETURN_IF_ERROR(recvs.wait(j, sends));
    const char* theirs = landing(j);
    const char* mine = at(in, sb * item);
    char* dst = at(out, sb * item);
    if (in_place) CASTMESH_RETURN_IF_ERROR(sends.wait_read(send_requests[j], call.sequence));
    if (s.rank() == 0) {
      op.combine3(mine, theirs, dst, se - sb);
    } else {
      op.combine3(theirs, mine, dst, se - sb);
    }
    op.finalize(dst, se - sb, 2);
    if (j + window < nseg) post(j + window);
  }
  return sends.wait_all();
}

// Binomial tree towards rank 0 over absolute ranks: rank r's accumulator
// covers ranks [r, r + 2^k) in order, so order-sensitive ops are exact.
absl::Status binomial_reduce_to_zero(const Steps& s, void* acc, size_t count, const Reduction& op) {
  const size_t bytes = count * dtype_size(op.dtype());
  const int p = s.size(), r = s.rank();
  std::vector<char> tmp(bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (r & mask) return s.send(r - mask, 0, acc, bytes);
    if (r + mask < p) {
      CASTMESH_RETURN_IF_ERROR(s.recv(r + mask, 0, tmp.data(), bytes));
      op.combine3(acc, tmp.data(), acc, count);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status run_barrier(const CollectiveCall& call) {
  Steps s(call);
  char none = 0;
  uint32_t step = 0;
  for (int k = 1; k < s.size(); k <<= 1, ++step) {
    CASTMESH_RETURN_IF_ERROR(s.exchange(mod(s.rank() + k, s.size()), &none, 0, mod(s.rank() - k, s.size()), &none, 0, step));
  }
  return absl::OkStatus();
}

absl::Status run_broadcast(const CollectiveCall& call, void* data, size_t bytes, int root) {
  Steps s(call);
  if (s.size() == 1) return absl::OkStatus();
  if (bytes <= kSmallMessageBytes || s.size() == 2) return binomial_broadcast(s, data, bytes, root);
  return chain_broadcast(s, data, bytes, root);
}

absl::Status run_allreduce(const CollectiveCall& call, const void* in, void* out, size_t count, const Reduction& op) {
  Steps s(call);
  const size_t bytes = count * dtype_size(op.dtype());
  if (s.size() > 1 && bytes > kSmallMessageBytes && count >= static_cast<size_t>(s.size()) &&
      (op.commutative() || s.size() == 2)) {
    // Both finalize each segment themselves and read `in` directly (no copy first).
    if (s.size() == 2 && bytes <= kTwoRankExchangeMaxBytes) {
      // Records that arrive while this thread combines wait for it, not for
      // the progress thread, which would take a core from the two ranks.
      const link::PollScope rings_held;
      return two_rank_exchange_allreduce(s, call, in, out, count, op);
    }
    return pipelined_ring_allreduce(s, call, in, out, count, op);
  }
  if (in != out && bytes > 0) std::memcpy(out, in, bytes);
  absl::Status st;
  if (s.size() == 1) {
    st = absl::OkStatus();
  } else {
    st = recursive_doubling_allreduce(s, out, count, op);
  }
  if (st.ok()) op.finalize(out, count, s.size());
  return st;
}

absl::Status run_reduce(const CollectiveCall& call, const void* in, void* out, size_t count, const Reduction& op,
                        int root) {
  Steps s(call);
  const size_t bytes = count * dtype_size(op.dtype());
  std::vector<char> acc(static_cast<const char*>(in), at(in, bytes));
  CASTMESH_RETURN_IF_ERROR(binomial_reduce_to_zero(s, acc.data(), count, op));
  // The sum is at rank 0; the root may be another rank.
  constexpr uint32_t kToRootStep = 1;
  if (s.rank() == 0 && root != 0) return s.send(root, kToRootStep, acc.data(), bytes);
  if (s.rank() == root) {
    if (root != 0) CASTMESH_RETURN_IF_ERROR(s.recv(0, kToRootStep, acc.data(), bytes));
    op.finalize(acc.data(), count, s.size());
    if (bytes > 0) std::memcpy(out, acc.data(), bytes);
  }
  return absl::OkStatus();
}

absl::Status run_allgather(const CollectiveCall& call, const void* in, void* out, size_t bytes) {
  Steps s(call);
  const int p = s.size(), r = s.rank();
  if (in != at(out, r * bytes) && bytes > 0) std::memmove(at(out, r * bytes), in, bytes);
  for (int step = 0; step < p - 1; ++step) {
    const int send_block = mod(r - step, p), recv_block = mod(r - step - 1, p);
    CASTMESH_RETURN_IF_ERROR(s.exchange(mod(r + 1, p), at(out, send_block * bytes), bytes, mod(r - 1, p),
                                        at(out, recv_block * bytes), bytes, static_cast<uint32_t>(step)));
  }
  return absl::OkStatus();
}

absl::Status run_gather(const CollectiveCall& call, const void* in, void* out, size_t bytes, int root) {
  Steps s(call);
  if (s.rank() != root) return s.send(root, 0, in, bytes);
  std::vector<std::shared_ptr<detail::RequestState>> incoming;
  for (int r = 0; r < s.size(); ++r) {
    if (r != root) incoming.push_back(s.post(r, 0, at(out, r * bytes), bytes));
  }
  if (in != at(out, root * bytes) && bytes > 0) std::memmove(at(out, root * bytes), in, bytes);
  return Steps::wait_all(incoming);
}

absl::Status run_scatter(const CollectiveCall& call, const void* in, void* out, size_t bytes, int root) {
  Steps s(call);
  if (s.rank() != root) return s.recv(root, 0, out, bytes);
  std::vector<std::shared_ptr<detail::RequestState>> outgoing;
  for (int i = 1; i < s.size(); ++i) {
    const int r = mod(root + i, s.size());
    outgoing.push_back(s.start_send(r, 0, at(in, r * bytes), bytes));
  }
  if (out != at(in, root * bytes) && bytes > 0) std::memmove(out, at(in, root * bytes), bytes);
  return Steps::wait_all(outgoing);
}

absl::Status run_reduce_scatter(const CollectiveCall& call, const void* in, void* out, size_t count,
                                const Reduction& op) {
  Steps s(call);
  const int p = s.size(), r = s.rank();
  const size_t item = dtype_size(op.dtype()), block = count * item;
  std::vector<char> work(static_cast<const char*>(in), at(in, p * block));
  if (!op.commutative()) {
    // Rank order matters: reduce everything at rank 0 in order, then scatter.
    CASTMESH_RETURN_IF_ERROR(binomial_reduce_to_zero(s, work.data(), count * p, op));
    if (r == 0) op.finalize(work.data(), count * p, p);
    const CollectiveCall scatter{call.group, call.sequence,
                                 std::make_shared<const std::string>(*call.signature + "/scatter")};
    return run_scatter(scatter, work.data(), out, block, 0);
  }
  std::vector<char> tmp(block);
  for (int step = 0; step < p - 1; ++step) {
    const int send_block = mod(r - step - 1, p), recv_block = mod(r - step - 2, p);
    CASTMESH_RETURN_IF_ERROR(s.exchange(mod(r + 1, p), at(work.data(), send_block * block), block, mod(r - 1, p),
                                        tmp.data(), block, static_cast<uint32_t>(step)));
    op.combine3(tmp.data(), at(work.data(), recv_block * block), at(work.data(), recv_block * block), count);
  }
  op.finalize(at(work.data(), r * block), count, p);
  if (block > 0) std::memcpy(out, at(work.data(), r * block), block);
  return absl::OkStatus();
}

absl::Status run_alltoall(const CollectiveCall& call, const void* in, void* out, size_t bytes) {
  Steps s(call);
  const int p = s.size(), r = s.rank();
  std::vector<std::shared_ptr<detail::RequestState>> incoming;
  for (int i = 1; i < p; ++i) {
    const int from = mod(r - i, p);
    incoming.push_back(s.post(from, 0, at(out, from * bytes), bytes));
  }
  std::vector<std::shared_ptr<detail::RequestState>> outgoing;
  for (int i = 1; i < p; ++i) {
    const int to = mod(r + i, p);
    outgoing.push_back(s.start_send(to, 0, at(in, to * bytes), bytes));
  }
  if (bytes > 0) std::memmove(at(out, r * bytes), at(in, r * bytes), bytes);
  // A send refused at once (not a peer that is gone, which fails its
  // receive too) would leave the receives waiting: stop now.
  for (const auto& send : outgoing) {
    if (auto done = send->test(); done && !done->ok()) return done->status();
  }
  absl::Status received = Steps::wait_all(incoming);
  absl::Status sent = Steps::wait_all(outgoing);
  return received.ok() ? sent : received;
}

}  // namespace castmesh::collectives
