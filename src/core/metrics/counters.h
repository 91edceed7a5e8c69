// Built-in metrics (docs/observability.md, "Metrics"): counters that are
// always on, so every counting site is a few relaxed atomic operations on
// memory the counted object (or the process) owns; no lock, no allocation.
// Writers: ActorCell (per actor), ProcHost (per transport), the
// collectives' CommGroup (per communicator, per data-plane path). The
// reader (debug/metrics_service.h) loads them with relaxed loads: a
// snapshot is consistent per counter, not across counters.
//
// Threading: every method is thread-safe unless it says "one writer"
// (then only the thread that owns the object calls it).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace castmesh::metrics {

// A monotonic count (a built-in metric; the user meters are castmesh/metrics.h's Counter).
class RelaxedCounter {
 public:
  // Any thread (one atomic read-modify-write).
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  // One writer: a load and a store, no locked instruction.
  void add_one_writer(uint64_t n = 1) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Handler run time buckets: upper bounds in ns (1 us ... 1 s); the last
// bucket counts the runs above the last bound.
inline constexpr std::array<int64_t, 7> kHandlerBucketBoundsNs = {1'000,      10'000,      100'000,      1'000'000,
                                                                 10'000'000, 100'000'000, 1'000'000'000};
inline constexpr size_t kHandlerBuckets = kHandlerBucketBoundsNs.size() + 1;

// One actor's counters; a member of its cell.
class ActorCounters {
 public:
  // A user message entered the mailbox. Any thread (the sender's).
  void on_delivered() {
    const uint64_t in = messages_in_.fetch_add(1, std::memory_order_relaxed) + 1;
    const uint64_t taken = taken_.get();
    const uint64_t depth = in > taken ? in - taken : 0;
    uint64_t max = mailbox_max_.load(std::memory_order_relaxed);
    while (depth > max && !mailbox_max_.compare_exchange_weak(max, depth, std::memory_order_relaxed)) {
    }
  }
  // A user message left the mailbox for its handler. One writer (the turn's thread).
  void on_taken() { taken_.add_one_writer(); }
  // Its handler ran for `ns`. One writer (the turn's thread).
  void on_handled(int64_t ns) {
    handler_count_.add_one_writer();
    const uint64_t run = ns > 0 ? static_cast<uint64_t>(ns) : 0;
    handler_ns_.add_one_writer(run);
    size_t b = 0;
    while (b < kHandlerBucketBoundsNs.size() && ns > kHandlerBucketBoundsNs[b]) ++b;
    handler_buckets_[b].add_one_writer();
  }
  // The actor sent a message to an actor while it ran. One writer (the turn's thread).
  void on_sent() { messages_out_.add_one_writer(); }

  uint64_t messages_in() const { return messages_in_.load(std::memory_order_relaxed); }
  uint64_t messages_out() const { return messages_out_.get(); }
  // Messages delivered and not yet taken (never negative, may lag by the
  // messages in flight between the two loads).
  uint64_t mailbox_depth() const {
    const uint64_t taken = taken_.get();
    const uint64_t in = messages_in();
    return in > taken ? in - taken : 0;
  }
  uint64_t mailbox_max() const { return mailbox_max_.load(std::memory_order_relaxed); }
  uint64_t handler_count() const { return handler_count_.get(); }
  uint64_t handler_ns() const { return handler_ns_.get(); }
  uint64_t handler_bucket(size_t b) const { return handler_buckets_[b].get(); }

 private:
  // Written by senders' threads, apart from the line the turn's thread
  // writes: a sender's increment does not pull that line away from the
  // actor's worker on every message (false sharing).
  alignas(64) std::atomic<uint64_t> messages_in_{0};
  std::atomic<uint64_t> mailbox_max_{0};
  alignas(64) RelaxedCounter taken_;
  RelaxedCounter messages_out_;
  RelaxedCounter handler_count_;
  RelaxedCounter handler_ns_;
  std::array<RelaxedCounter, kHandlerBuckets> handler_buckets_;
};

// Messages and bytes one way and the other.
struct FlowCounters {
  RelaxedCounter messages_in, bytes_in, messages_out, bytes_out;
  void in(uint64_t bytes) {
    messages_in.add();
    bytes_in.add(bytes);
  }
  void out(uint64_t bytes) {
    messages_out.add();
    bytes_out.add(bytes);
  }
};

// The proc's transports, by the scheme of the peer's address.
enum class Transport : uint8_t { kUnix, kTcp, kOther };
inline constexpr size_t kTransports = 3;
Transport transport_of(std::string_view proc_id);
std::string_view transport_name(Transport transport);
// This process's counters of frames to and from other procs on `transport`
// (actor messages, answers, control and data messages; not heartbeats).
FlowCounters& transport(Transport transport);

// Data-plane paths (link::Path's values, named by link::path_name): bytes
// and messages the collectives and RDMA moved on each.
inline constexpr size_t kMaxPaths = 16;
// Counts `bytes` out (or in) on path `index`, named `name` (static storage,
// e.g. link::path_name's). An index >= kMaxPaths is ignored.
void count_path(unsigned index, std::string_view name, bool outbound, uint64_t bytes);
// The paths used so far: (name, counters).
std::vector<std::pair<std::string, const FlowCounters*>> paths();

// Collective kinds ("allreduce", "broadcast", ...): a process-wide table.
inline constexpr size_t kMaxCollectiveKinds = 32;
// The slot of kind `name`, given one on first sight (takes a lock: call it
// once per signature, not per call). Kinds beyond the table share the last
// slot, named "other".
size_t collective_kind(std::string_view name);
std::string collective_kind_name(size_t slot);

// One communicator rank's calls and bytes per kind; registered with the
// process's list while it lives (the constructor and destructor lock).
class CommunicatorCounters {
 public:
  CommunicatorCounters(std::string description, int rank, int size);
  ~CommunicatorCounters();
  CommunicatorCounters(const CommunicatorCounters&) = delete;
  CommunicatorCounters& operator=(const CommunicatorCounters&) = delete;

  // One call of kind `slot` (collective_kind) with `bytes` of user data. Any thread.
  void on_call(size_t slot, uint64_t bytes) {
    Kind& k = kinds_[slot < kMaxCollectiveKinds ? slot : kMaxCollectiveKinds - 1];
    k.calls.add();
    k.bytes.add(bytes);
  }

  struct Kind {
    RelaxedCounter calls, bytes;
  };
  const std::string& description() const { return description_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const Kind& kind(size_t slot) const { return kinds_[slot]; }

  // Runs `fn` on every live communicator's counters, under the list's lock.
  static void for_each(const std::function<void(const CommunicatorCounters&)>& fn);

 private:
  const std::string description_;
  const int rank_;
  const int size_;
  std::array<Kind, kMaxCollectiveKinds> kinds_;
};

}  // namespace castmesh::metrics
