// Internal: the mailbox node that carries one message, and the type-erased
// reply target of a request. Not for direct use; included by the public
// headers because their templates build envelopes.
#pragma once

#include <absl/status/status.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "castmesh/address.h"

namespace castmesh {
class Actor;
namespace detail {

// Where the answer of a request goes: the shared state of a Future in this
// process, or a port in another process. Reference counted by its promises
// (OncePort copies); dropping the last promise without answering fails the
// request ("reply port dropped without a reply"). Thread-safe.
class ReplySink {
 public:
  virtual void add_promise() = 0;
  virtual void drop_promise() = 0;
  // Type id of the value this sink accepts; 0 when it accepts any type
  // that has a codec (a port of another proc).
  virtual uint32_t value_type() const = 0;
  // Moves the value from *(T*)value, where type == type_id<T>(). A type the
  // sink does not accept fails the request (kInvalidArgument) instead.
  virtual void complete_value(uint32_t type, void* value) = 0;
  virtual void complete_error(absl::Status status) = 0;
  // True once the receiver cancelled; the answer would be dropped.
  virtual bool cancelled() const = 0;
  // The serializable address of this sink (registers it with the current
  // runtime if it lives in this process).
  virtual PortAddress port_address() = 0;

 protected:
  ~ReplySink() = default;
};

// One promise reference to a ReplySink; move-only. Empty for tells.
class ReplyRef {
 public:
  ReplyRef() = default;
  explicit ReplyRef(ReplySink* sink) : sink_(sink) {
    if (sink_) sink_->add_promise();
  }
  // Takes over a promise the sink already counts (see
  // FutureStateBase::with_first_promise) instead of adding one.
  static ReplyRef adopt(ReplySink* sink) {
    ReplyRef r;
    r.sink_ = sink;
    return r;
  }
  ReplyRef(ReplyRef&& o) noexcept : sink_(std::exchange(o.sink_, nullptr)) {}
  ReplyRef& operator=(ReplyRef&& o) noexcept {
    if (this != &o) {
      reset();
      sink_ = std::exchange(o.sink_, nullptr);
    }
    return *this;
  }
  ReplyRef(const ReplyRef&) = delete;
  ReplyRef& operator=(const ReplyRef&) = delete;
  ~ReplyRef() { reset(); }

  explicit operator bool() const { return sink_ != nullptr; }
  ReplySink* get() const { return sink_; }
  void reset() {
    if (sink_) std::exchange(sink_, nullptr)->drop_promise();
  }
  // Answers and releases the promise. No-op when empty.
  void complete_value(uint32_t type, void* value) {
    if (sink_) {
      sink_->complete_value(type, value);
      reset();
    }
  }
  void complete_error(absl::Status status) {
    if (sink_) {
      sink_->complete_error(std::move(status));
      reset();
    }
  }

 private:
  ReplySink* sink_ = nullptr;
};

// Memory for envelopes and future states: per-thread free lists by size
// class, exchanged between threads in batches (a message is usually freed on
// another thread than the one that allocated it). Plain new/delete in
// sanitizer builds. Any thread.
void* allocate_message_memory(std::size_t size);
void free_message_memory(void* p, std::size_t size) noexcept;

// Gives a class (and its subclasses, through a virtual destructor) the
// message memory allocator.
struct MessageMemory {
  static void* operator new(std::size_t n) { return allocate_message_memory(n); }
  static void operator delete(void* p, std::size_t n) noexcept { free_message_memory(p, n); }
  static void* operator new(std::size_t n, std::align_val_t a) { return ::operator new(n, a); }
  static void operator delete(void* p, std::size_t n, std::align_val_t a) noexcept { ::operator delete(p, n, a); }
};

// Kinds of envelopes; only kUser goes through handler tables.
enum class EnvelopeKind : uint8_t { kUser, kStop, kClosure, kDown, kSupervision };

// Runs the handler for an envelope on an actor; completes env->reply.
using HandlerFn = void (*)(Actor* actor, struct Envelope* env);

// One message. Owned by whoever holds the pointer: the sender until push,
// the mailbox, then the dispatching actor.
struct Envelope : MessageMemory {
  // Links the messages a closing mailbox hands back (Mailbox::drain); the
  // queue itself keeps envelopes in array slots, not in this chain.
  Envelope* next = nullptr;
  uint32_t type_id = 0;
  // Class id of the actor `handler` was resolved for (typed sends); the
  // receiver uses `handler` only when its own class id matches.
  uint32_t handler_class = 0;
  HandlerFn handler = nullptr;
  EnvelopeKind kind = EnvelopeKind::kUser;
  ReplyRef reply;
  // While a trace records (castmesh/trace.h): when the message was queued,
  // and the flow id of the cross-proc send it came from (0: none).
  int64_t trace_queued_ns = 0;
  uint64_t trace_flow = 0;

  Envelope() = default;
  Envelope(const Envelope&) = delete;
  Envelope& operator=(const Envelope&) = delete;
  virtual ~Envelope() = default;
  virtual void* payload() { return nullptr; }
};

template <typename T>
struct TypedEnvelope final : Envelope {
  TypedEnvelope() = default;
  template <typename U>
  explicit TypedEnvelope(U&& v) : value(std::forward<U>(v)) {}
  void* payload() override { return &value; }
  T value;
};

// A function to run inside an actor (Actor::on_complete, internal work).
struct ClosureEnvelope : Envelope {
  ClosureEnvelope() { kind = EnvelopeKind::kClosure; }
  virtual void run() = 0;
};

template <typename F>
struct TypedClosureEnvelope final : ClosureEnvelope {
  explicit TypedClosureEnvelope(F f) : fn(std::move(f)) {}
  void run() override { fn(); }
  F fn;
};

}  // namespace detail
}  // namespace castmesh
