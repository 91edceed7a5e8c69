// References to actors: ActorRef<A> (typed) and UntypedRef (any actor).
//
// A ref is an address (proc/name[index]) plus an in-process cache of what it
// resolves to. Copyable, comparable and hashable by address, printable, and
// serializable (to_bytes / from_bytes) so it can travel inside messages to
// other processes. Any thread may copy a ref and send through it.
#pragma once

#include <absl/status/statusor.h>

#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "castmesh/address.h"
#include "castmesh/detail/destination.h"
#include "castmesh/detail/handlers.h"
#include "castmesh/future.h"

namespace castmesh {

template <typename T>
class Port;
template <typename A>
class ActorRef;

class UntypedRef {
 public:
  UntypedRef() = default;
  explicit UntypedRef(std::shared_ptr<detail::Destination> destination) : destination_(std::move(destination)) {}
  // A ref to `address`, resolved through Runtime::current() when used.
  static UntypedRef from_address(Address address) { return UntypedRef(detail::unresolved_destination(std::move(address))); }
  static absl::StatusOr<UntypedRef> from_bytes(std::string_view bytes) {
    auto a = Address::from_bytes(bytes);
    if (!a.ok()) return a.status();
    return from_address(std::move(*a));
  }

  bool valid() const { return destination_ != nullptr; }
  const Address& address() const {
    static const Address kEmpty;
    return destination_ ? destination_->address() : kEmpty;
  }
  std::string to_string() const { return address().to_string(); }
  std::string to_bytes() const { return address().to_bytes(); }

  // Sends `msg` without waiting for an answer. The receiver's handler table
  // is consulted at delivery; an unknown type is logged by the receiver.
  template <typename M>
  void tell(M&& msg) const {
    deliver(make_envelope(std::forward<M>(msg)));
  }
  // Sends a request whose answer has type R. If the receiver's handler for M
  // answers another type, or it has none, the future fails (kInvalidArgument
  // / kUnimplemented naming the actor and the type).
  template <typename R, typename M>
  Future<R> ask(M&& msg) const {
    auto* env = make_envelope(std::forward<M>(msg));
    detail::ensure_codec<R>();
    auto* state = new detail::FutureState<R>();
    env->reply = detail::ReplyRef::adopt(state->with_first_promise());
    Future<R> f(state);
    deliver(env);
    return f;
  }
  // Asks the actor to stop once the messages already in its mailbox (from
  // each sender, those sent before this call) are handled.
  void stop() const {
    if (destination_) detail::request_stop(*destination_);
  }

  // Typed view. No check is possible for remote actors; for local ones a
  // wrong class gives kInvalidArgument.
  template <typename A>
  absl::StatusOr<ActorRef<A>> as() const;

  const std::shared_ptr<detail::Destination>& destination() const& { return destination_; }
  // From a temporary ref (`self().destination()`): the pointer moves out, so
  // no reference-count increment and decrement pair (two atomic operations on
  // every Actor::on_complete).
  std::shared_ptr<detail::Destination> destination() && { return std::move(destination_); }

  friend bool operator==(const UntypedRef& a, const UntypedRef& b) {
    return a.destination_ == b.destination_ || a.address() == b.address();
  }
  friend auto operator<=>(const UntypedRef& a, const UntypedRef& b) { return a.address() <=> b.address(); }
  template <typename H>
  friend H AbslHashValue(H h, const UntypedRef& r) {
    return H::combine(std::move(h), r.address());
  }
  friend std::ostream& operator<<(std::ostream& os, const UntypedRef& r) { return os << r.address(); }

 protected:
  template <typename M>
  static detail::Envelope* make_envelope(M&& msg) {
    using Msg = std::decay_t<M>;
    detail::ensure_codec<Msg>();
    auto* env = new detail::TypedEnvelope<Msg>(std::forward<M>(msg));
    env->type_id = type_id<Msg>();
    return env;
  }
  void deliver(detail::Envelope* env) const {
    if (destination_) {
      destination_->deliver(env);
    } else {
      detail::reject(env, absl::FailedPreconditionError("send through an empty actor ref"));
    }
  }

  std::shared_ptr<detail::Destination> destination_;
};

// A typed ref to an actor of class A. tell/ask check at compile time that A
// has a handler for the message; ask's Future type comes from the handler's
// return type (T, absl::StatusOr<T>, Future<T> -> Future<T>; void,
// absl::Status -> Future<Unit>).
template <typename A>
class ActorRef : public UntypedRef {
 public:
  ActorRef() = default;
  explicit ActorRef(std::shared_ptr<detail::Destination> destination) : UntypedRef(std::move(destination)) {}
  static ActorRef from_address(Address address) { return ActorRef(detail::unresolved_destination(std::move(address))); }
  static absl::StatusOr<ActorRef> from_bytes(std::string_view bytes) {
    auto a = Address::from_bytes(bytes);
    if (!a.ok()) return a.status();
    return from_address(std::move(*a));
  }

  template <typename M>
  void tell(M&& msg) const {
    using Msg = std::decay_t<M>;
    using H = detail::HandlerFor<A, Msg>;
    detail::ensure_codec<Msg>();
    auto* env = new detail::TypedEnvelope<Msg>(std::forward<M>(msg));
    env->type_id = type_id<Msg>();
    env->handler = &H::invoke;
    env->handler_class = type_id<A>();
    deliver(env);
  }

  template <typename M>
  auto ask(M&& msg) const -> Future<typename detail::HandlerFor<A, std::decay_t<M>>::reply_type> {
    using Msg = std::decay_t<M>;
    using H = detail::HandlerFor<A, Msg>;
    using R = typename H::reply_type;
    detail::ensure_codec<Msg>();
    detail::ensure_codec<R>();
    auto* env = new detail::TypedEnvelope<Msg>(std::forward<M>(msg));
    env->type_id = type_id<Msg>();
    env->handler = &H::invoke;
    env->handler_class = type_id<A>();
    auto* state = new detail::FutureState<R>();
    env->reply = detail::ReplyRef::adopt(state->with_first_promise());
    Future<R> f(state);
    deliver(env);
    return f;
  }

  // A port that accepts M and forwards it to this actor's handler for M.
  template <typename M>
  Port<M> port() const {
    (void)sizeof(detail::HandlerFor<A, M>);
    return Port<M>(*this);
  }
};

template <typename A>
absl::StatusOr<ActorRef<A>> UntypedRef::as() const {
  if (!destination_) return absl::FailedPreconditionError("empty actor ref");
  const uint32_t cls = destination_->actor_class();
  if (cls != 0 && cls != type_id<A>()) {
    return absl::InvalidArgumentError(std::string("actor ") + to_string() + " is not a " +
                                      std::string(type_name<A>()));
  }
  return ActorRef<A>(destination_);
}

}  // namespace castmesh

template <>
struct std::hash<castmesh::UntypedRef> {
  size_t operator()(const castmesh::UntypedRef& r) const { return std::hash<castmesh::Address>{}(r.address()); }
};
template <typename A>
struct std::hash<castmesh::ActorRef<A>> {
  size_t operator()(const castmesh::ActorRef<A>& r) const { return std::hash<castmesh::Address>{}(r.address()); }
};
