// Mailbox: the lock-free multi-producer single-consumer queue of one actor.
//
// An unbounded queue of array segments. A producer claims the next position
// with one CAS on `tail_` and stores its envelope pointer into that slot; the
// consumer reads the slots in position order, so messages come out in claim
// order (FIFO per sender, and globally in linearization order). Unlike an
// intrusive linked list, the consumer does not chase a chain of `next`
// pointers through lines the producers wrote (one dependent cache miss per
// message when a receiver falls behind): it reads consecutive slots (eight
// per line, which the hardware prefetches) and prefetches the envelopes a few
// slots ahead, so their misses overlap.
//
// Positions: each segment has kSlots slots plus one sentinel position
// (offset kSlots). The producer that claims a segment's last slot moves the
// tail onto the sentinel, links a new segment (allocated before its CAS, so
// the window is a few stores), then moves the tail past the sentinel;
// producers that see the sentinel wait for that. A producer dereferences only
// the segment of the slot it claimed, and its slot store is its last access,
// so the consumer frees a segment once it has read all its slots.
//
// Two flag bits in `tail_` encode the actor's scheduling state:
//  * kBlockedBit: empty and not scheduled. The push that clears it (the
//    first claim after the consumer blocked) returns kUnblocked and that
//    producer must schedule the actor (exactly once).
//  * kClosedBit: the actor stopped; pushes are refused (kClosed) so the
//    sender can fail the request at once.
// push() may be called from any thread; every other method only by the one
// thread currently running the actor.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "castmesh/detail/envelope.h"
#include "core/scheduler/futex.h"

namespace castmesh::detail {

class Mailbox {
 public:
  enum class PushResult { kOk, kUnblocked, kClosed };

  // Slots per segment: a segment (slots + link) is one 512-byte block of
  // message memory.
  static constexpr uint64_t kSlots = 63;

  Mailbox() = default;
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;
  ~Mailbox() {
    if (!closed()) {
      for (Envelope* e = drain(tail_.load(std::memory_order_acquire) >> kFlagBits); e != nullptr;) {
        delete std::exchange(e, e->next);
      }
    }
    Segment* s = head_seg_ != nullptr ? head_seg_ : first_seg_.load(std::memory_order_acquire);
    while (s != nullptr) free_segment(std::exchange(s, s->next.load(std::memory_order_acquire)));
  }

  PushResult push(Envelope* e) {
    Segment* spare = nullptr;  // the next segment, when this push claims a segment's last slot
    uint64_t t = tail_.load(std::memory_order_acquire);
    for (int spins = 0;;) {
      if (t & kClosedBit) {
        delete spare;
        return PushResult::kClosed;
      }
      const uint64_t pos = t >> kFlagBits;
      const uint64_t off = pos % kLap;
      if (off == kSlots) {  // the claimer of the last slot is linking the next segment
        wait_a_little(spins);
        t = tail_.load(std::memory_order_acquire);
        continue;
      }
      // Consistent with `t` if the CAS below succeeds: tail_seg_ only
      // changes while the tail is on a sentinel, and tail values never recur.
      Segment* seg = producer_segment();
      if (off + 1 == kSlots && spare == nullptr) spare = new Segment;
      if (tail_.compare_exchange_weak(t, (pos + 1) << kFlagBits, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        if (off + 1 == kSlots) {
          seg->next.store(spare, std::memory_order_release);
          tail_seg_.store(spare, std::memory_order_release);
          tail_.fetch_add(uint64_t{1} << kFlagBits, std::memory_order_release);  // past the sentinel
          spare = nullptr;
        }
        seg->slots[off].store(e, std::memory_order_release);  // last access to seg
        delete spare;
        return (t & kBlockedBit) ? PushResult::kUnblocked : PushResult::kOk;
      }
    }
  }

  // Consumer: marks the (new) mailbox as scheduled, before its first turn.
  void mark_scheduled() {
    uint64_t expected = (head_pos_ << kFlagBits) | kBlockedBit;
    tail_.compare_exchange_strong(expected, head_pos_ << kFlagBits, std::memory_order_acq_rel);
  }

  // Consumer: next message in FIFO order, or nullptr if empty right now.
  Envelope* pop() {
    if (head_seg_ == nullptr && !attach_first_segment()) return nullptr;
    const uint64_t off = head_pos_ % kLap;
    Envelope* e = head_seg_->slots[off].load(std::memory_order_acquire);
    if (e == nullptr) {
      if ((tail_.load(std::memory_order_acquire) >> kFlagBits) == head_pos_) return nullptr;
      e = wait_for_slot(head_seg_->slots[off]);  // claimed, its producer is storing it
    }
    advance(off);
    // Envelopes a few slots ahead are loaded while this one is handled: a
    // receiver far behind its senders reads envelopes the senders' cores
    // wrote long ago, and these misses overlap instead of coming one by one.
    const uint64_t ahead = head_pos_ % kLap + kPrefetchDistance;
    if (ahead < kSlots) {
      if (Envelope* p = head_seg_->slots[ahead].load(std::memory_order_relaxed)) __builtin_prefetch(p);
    }
    return e;
  }

  // Consumer: true if messages are waiting (or being stored).
  bool has_messages() const { return (tail_.load(std::memory_order_acquire) >> kFlagBits) != head_pos_; }

  // Consumer: if empty, marks the actor idle (kBlockedBit) and returns true;
  // after that the next push reschedules it. False if messages arrived.
  bool try_block() {
    uint64_t expected = head_pos_ << kFlagBits;
    return tail_.compare_exchange_strong(expected, expected | kBlockedBit, std::memory_order_acq_rel,
                                         std::memory_order_acquire);
  }

  // Consumer: refuses further pushes and returns the messages still queued,
  // in FIFO order, linked through Envelope::next (caller owns them).
  Envelope* close() { return drain(tail_.fetch_or(kClosedBit, std::memory_order_acq_rel) >> kFlagBits); }

  bool closed() const { return (tail_.load(std::memory_order_acquire) & kClosedBit) != 0; }

 private:
  struct Segment : MessageMemory {
    std::atomic<Envelope*> slots[kSlots] = {};
    std::atomic<Segment*> next{nullptr};
  };
  static_assert(sizeof(Segment) == 512, "one block of the largest message memory size class");

  static constexpr uint64_t kLap = kSlots + 1;  // positions per segment, with the sentinel
  static constexpr int kFlagBits = 2;
  static constexpr uint64_t kBlockedBit = 1;
  static constexpr uint64_t kClosedBit = 2;
  static constexpr uint64_t kPrefetchDistance = 8;

  // Consumer: moves past the slot at offset `off` of the head segment (and
  // past the sentinel into the next segment after the last slot).
  void advance(uint64_t off) {
    if (off + 1 < kSlots) {
      ++head_pos_;
      return;
    }
    // The last slot's producer linked `next` before storing its slot.
    Segment* next = head_seg_->next.load(std::memory_order_acquire);
    free_segment(std::exchange(head_seg_, next));
    head_pos_ += 2;
  }

  // Consumer: takes every message at positions below `end` (all claimed),
  // in order, linked through Envelope::next.
  Envelope* drain(uint64_t end) {
    Envelope* first = nullptr;
    Envelope** link = &first;
    while (head_pos_ < end) {
      if (head_seg_ == nullptr) head_seg_ = first_seg_.load(std::memory_order_acquire);
      const uint64_t off = head_pos_ % kLap;
      Envelope* e = wait_for_slot(head_seg_->slots[off]);
      advance(off);
      *link = e;
      link = &e->next;
    }
    *link = nullptr;
    return first;
  }

  // A claimed slot whose producer has not stored it yet (it was between its
  // CAS and its store): a few instructions, unless it was preempted there.
  static Envelope* wait_for_slot(const std::atomic<Envelope*>& slot) {
    for (int spins = 0;;) {
      if (Envelope* e = slot.load(std::memory_order_acquire)) return e;
      wait_a_little(spins);
    }
  }
  static void wait_a_little(int& spins) {
    if (++spins < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }

  static void free_segment(Segment* s) { delete s; }

  // Producer, before its CAS: the segment of the tail position. tail_seg_
  // stays null until the first segment fills up; the first segment itself is
  // allocated by the first push (an actor that gets no message, like most
  // short-lived ones, allocates none) and published in first_seg_ before
  // that push's CAS.
  Segment* producer_segment() {
    if (Segment* seg = tail_seg_.load(std::memory_order_acquire)) return seg;
    Segment* first = first_seg_.load(std::memory_order_acquire);
    if (first != nullptr) return first;
    auto* fresh = new Segment;
    if (first_seg_.compare_exchange_strong(first, fresh, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return fresh;
    }
    delete fresh;
    return first;
  }

  // Consumer, before its first read: takes the first segment once a push
  // has claimed a position (its producer published the segment before).
  bool attach_first_segment() {
    if ((tail_.load(std::memory_order_acquire) >> kFlagBits) == head_pos_) return false;
    head_seg_ = first_seg_.load(std::memory_order_acquire);
    return true;
  }

  // Producers' fields: claimed positions (<< kFlagBits) | flags, the
  // segment of the tail position once past the first, and the first
  // segment. Starts blocked: a new actor is scheduled explicitly by spawn.
  // Not cache-line aligned (an over-aligned ActorCell would need aligned
  // operator new), only kept 64 bytes apart so that the producers' CAS and
  // the consumer's per-message updates never share a line.
  std::atomic<uint64_t> tail_{kBlockedBit};
  std::atomic<Segment*> tail_seg_{nullptr};
  std::atomic<Segment*> first_seg_{nullptr};
  [[maybe_unused]] char producer_consumer_gap_[64];
  // Consumer's fields: the next position to read and its segment (null
  // until the first message).
  uint64_t head_pos_ = 0;
  Segment* head_seg_ = nullptr;
};

}  // namespace castmesh::detail
