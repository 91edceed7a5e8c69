// FakeLink: a link for tests that delivers messages between ranks of this
// process in an order the test decides, holds them until the test opens
// its gate, and fails the n-th send, deterministically and without sleeps.
// Installed through CommGroup::Layout::test_link, it carries every message
// of a communicator whose ranks all live in the test process, so the
// algorithms run over it exactly as over a real link.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "castmesh/detail/mutex.h"
#include "core/collectives/exchange.h"
#include "core/link/link.h"

namespace castmesh::testing {

class FakeLink final : public link::Link {
 public:
  enum class Order {
    kFifo,     // in the order they were sent
    kReverse,  // each batch of held messages newest first (per (comm, source, dest, tag): oldest first)
  };
  struct Options {
    Order order = Order::kFifo;
    // Held until open() (else delivered as they come).
    bool gate_closed = false;
    // The n-th post_send (1-based, counted over all ranks) fails with
    // kUnavailable and is never delivered; 0: none does.
    uint64_t fail_nth = 0;
    // The bytes are read from the sender's buffer at delivery (the request
    // completes then: send_holds_buffer); else copied when sent.
    bool read_at_delivery = false;
  };

  explicit FakeLink(Options options) : options_(options), pump_([this] { pump(); }) {}
  ~FakeLink() override {
    {
      detail::MutexLock lock(mu_);
      stopping_ = true;
      gate_open_ = true;
    }
    cv_.notify_all();
    pump_.join();
  }

  link::Path path(const ProcId&) const override { return link::Path::kFake; }
  link::Capabilities capabilities() const override {
    link::Capabilities caps;
    caps.send_holds_buffer = options_.read_at_delivery;
    return caps;
  }
  std::shared_ptr<detail::RequestState> post_send(const ProcId&, const link::Envelope& e, const void* data,
                                                  size_t bytes) override {
    auto request = std::make_shared<detail::RequestState>();
    Held held{std::string(e.comm), std::string(e.signature), e, data, bytes, {}, request};
    if (!options_.read_at_delivery) held.copy.assign(static_cast<const char*>(data), bytes);
    detail::MutexLock lock(mu_);
    if (++posted_ == options_.fail_nth) {
      ++failed_;
      lock.unlock();
      request->complete(absl::UnavailableError("FakeLink: this send fails (fail_nth)"));
      return request;
    }
    held_.push_back(std::move(held));
    lock.unlock();
    cv_.notify_all();
    // Copied: the sender may reuse its buffer now.
    if (!options_.read_at_delivery) request->complete(MessageStatus{e.source, static_cast<int>(e.tag), bytes});
    return request;
  }
  absl::Status send_abort(const ProcId&, const link::Envelope& e, const absl::Status& why) override {
    collectives::Exchange::instance().mailbox(std::string(e.comm), e.dest)->abort_collective(e.sequence, why);
    return absl::OkStatus();
  }

  // Lets held messages go (and every later one at once).
  void open() {
    {
      detail::MutexLock lock(mu_);
      gate_open_ = true;
    }
    cv_.notify_all();
  }
  // Messages delivered so far, sends failed so far, messages held now.
  uint64_t delivered() {
    detail::MutexLock lock(mu_);
    return delivered_;
  }
  uint64_t failed() {
    detail::MutexLock lock(mu_);
    return failed_;
  }
  size_t held() {
    detail::MutexLock lock(mu_);
    return held_.size();
  }

 private:
  struct Held {
    std::string comm;
    std::string signature;
    link::Envelope envelope;  // comm and signature: see deliver()
    const void* data = nullptr;
    size_t bytes = 0;
    std::string copy;  // the bytes, unless read_at_delivery
    std::shared_ptr<detail::RequestState> request;
  };
  static bool same_stream(const Held& a, const Held& b) {
    return a.comm == b.comm && a.envelope.source == b.envelope.source && a.envelope.dest == b.envelope.dest &&
           a.envelope.tag == b.envelope.tag && a.envelope.collective == b.envelope.collective;
  }
  void deliver(Held& m) {
    link::Envelope message = m.envelope;  // its views point at the message's own strings
    message.comm = m.comm;
    message.signature = m.signature;
    const char* body = options_.read_at_delivery ? static_cast<const char*>(m.data) : m.copy.data();
    collectives::Exchange::instance().on_compact(message, body, m.bytes);
    m.request->complete(MessageStatus{m.envelope.source, static_cast<int>(m.envelope.tag), m.bytes});
  }
  // The pump thread: takes what is held once the gate is open, and delivers
  // it in the chosen order.
  void pump() {
    for (;;) {
      std::deque<Held> batch;
      {
        detail::MutexLock lock(mu_);
        cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || (gate_open_ && !held_.empty());
        });
        if (held_.empty() && stopping_) return;
        batch.swap(held_);
      }
      std::vector<bool> done(batch.size(), false);
      auto send = [&](size_t i) {
        // Older messages of the same stream first: MPI's order per (source, tag) holds.
        for (size_t j = 0; j < i; ++j) {
          if (!done[j] && same_stream(batch[j], batch[i])) {
            deliver(batch[j]);
            done[j] = true;
          }
        }
        deliver(batch[i]);
        done[i] = true;
      };
      if (options_.order == Order::kFifo) {
        for (size_t i = 0; i < batch.size(); ++i) send(i);
      } else {
        for (size_t i = batch.size(); i-- > 0;) {
          if (!done[i]) send(i);
        }
      }
      detail::MutexLock lock(mu_);
      delivered_ += batch.size();
    }
  }

  const Options options_;
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
  bool gate_open_ ABSL_GUARDED_BY(mu_) = !options_.gate_closed;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread pump_;  // last: starts after the fields it reads
};

}  // namespace castmesh::testing
