// Mailbox: the lock-free multi-producer single-consumer queue of one actor.
//
// Producers push with one CAS onto an intrusive LIFO stack (the envelope is
// the node; no allocation). The consumer takes the whole stack with one
// exchange and reverses it into a private FIFO cache, so messages come out
// in push order (FIFO per sender, and globally in linearization order).
// Two tag values in the head encode the actor's scheduling state:
//  * kBlocked: empty and not scheduled. The push that replaces it returns
//    kUnblocked and that producer must schedule the actor (exactly once).
//  * kClosed: the actor stopped; pushes are refused (kClosed) so the sender
//    can fail the request at once.
// push() may be called from any thread; every other method only by the one
// thread currently running the actor.
#pragma once

#include <atomic>
#include <cstdint>

#include "castmesh/detail/envelope.h"

namespace castmesh::detail {

class Mailbox {
 public:
  enum class PushResult { kOk, kUnblocked, kClosed };

  Mailbox() = default;
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;
  ~Mailbox() { delete_list(cache_); }

  PushResult push(Envelope* e) {
    Envelope* head = head_.load(std::memory_order_relaxed);
    for (;;) {
      if (head == closed_tag()) return PushResult::kClosed;
      e->next = head == blocked_tag() ? nullptr : head;
      if (head_.compare_exchange_weak(head, e, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        return head == blocked_tag() ? PushResult::kUnblocked : PushResult::kOk;
      }
    }
  }

  // Consumer: marks the (new) mailbox as scheduled, before its first turn.
  void mark_scheduled() {
    Envelope* expected = blocked_tag();
    head_.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
  }

  // Consumer: next message in FIFO order, or nullptr if empty right now.
  Envelope* pop() {
    if (cache_ == nullptr) {
      if (head_.load(std::memory_order_relaxed) == nullptr) return nullptr;
      Envelope* stack = head_.exchange(nullptr, std::memory_order_acquire);
      cache_ = reverse(stack);
      if (cache_ == nullptr) return nullptr;
    }
    Envelope* e = cache_;
    cache_ = e->next;
    // The next message is loaded while this one is handled: a long cache
    // (a receiver far behind its senders) no longer fits in the L1/L2 that
    // reverse() walked it through.
    if (cache_ != nullptr) __builtin_prefetch(cache_);
    e->next = nullptr;
    return e;
  }

  // Consumer: true if messages are waiting (cache or stack).
  bool has_messages() const {
    return cache_ != nullptr || head_.load(std::memory_order_acquire) != nullptr;
  }

  // Consumer: if empty, marks the actor idle (kBlocked) and returns true;
  // after that the next push reschedules it. False if messages arrived.
  bool try_block() {
    if (cache_ != nullptr) return false;
    Envelope* expected = nullptr;
    return head_.compare_exchange_strong(expected, blocked_tag(), std::memory_order_acq_rel,
                                         std::memory_order_acquire);
  }

  // Consumer: refuses further pushes and returns the messages still queued,
  // in FIFO order (caller owns them).
  Envelope* close() {
    Envelope* stack = head_.exchange(closed_tag(), std::memory_order_acq_rel);
    if (stack == blocked_tag() || stack == closed_tag()) stack = nullptr;
    Envelope* rest = reverse(stack);
    if (cache_ == nullptr) return rest;
    Envelope* tail = cache_;
    while (tail->next) tail = tail->next;
    tail->next = rest;
    return std::exchange(cache_, nullptr);
  }

  bool closed() const { return head_.load(std::memory_order_acquire) == closed_tag(); }

 private:
  static Envelope* blocked_tag() { return reinterpret_cast<Envelope*>(uintptr_t{1}); }
  static Envelope* closed_tag() { return reinterpret_cast<Envelope*>(uintptr_t{2}); }

  static Envelope* reverse(Envelope* e) {
    Envelope* out = nullptr;
    while (e) {
      Envelope* next = e->next;
      e->next = out;
      out = e;
      e = next;
    }
    return out;
  }
  static void delete_list(Envelope* e) {
    while (e) delete std::exchange(e, e->next);
  }

  // Starts blocked: a new actor is scheduled explicitly by spawn.
  std::atomic<Envelope*> head_{blocked_tag()};
  Envelope* cache_ = nullptr;
};

}  // namespace castmesh::detail
