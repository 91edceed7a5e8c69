// Ports: typed addresses that accept messages and can themselves be sent in
// messages, so an actor can hand a reply address to a third actor.
//
//  * OncePort<T> accepts one answer (the reply side of a request). Copies
//    share one target; the first send/fail wins and later ones are ignored.
//    If every copy is dropped without an answer, the waiting Future fails
//    with "reply port dropped without a reply".
//  * Port<T> accepts many messages of type T and forwards each to an actor's
//    handler for T.
// Both are serializable (to_bytes/from_bytes). Any thread may use them.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <utility>

#include "castmesh/address.h"
#include "castmesh/future.h"
#include "castmesh/ref.h"

namespace castmesh {

namespace detail {
// A reply sink in another proc (or this one, reached through its port
// address); answering encodes the value and routes it. Starts with zero
// promises; deleted when the last promise is dropped.
ReplySink* make_remote_reply_sink(PortAddress port, uint32_t value_type);
}  // namespace detail

template <typename T>
class OncePort {
 public:
  OncePort() = default;
  // Adds one promise reference to `sink`.
  explicit OncePort(detail::ReplySink* sink) : sink_(sink) {
    if (sink_) sink_->add_promise();
  }
  OncePort(const OncePort& o) : OncePort(o.sink_) {}
  OncePort(OncePort&& o) noexcept : sink_(std::exchange(o.sink_, nullptr)) {}
  OncePort& operator=(OncePort o) noexcept {
    std::swap(sink_, o.sink_);
    return *this;
  }
  ~OncePort() {
    if (sink_) sink_->drop_promise();
  }

  bool valid() const { return sink_ != nullptr; }
  // Answers with `value` (ignored if already answered or cancelled).
  void send(T value) const {
    if (sink_) sink_->complete_value(type_id<T>(), &value);
  }
  // Answers with an error.
  void fail(absl::Status status) const {
    if (sink_) sink_->complete_error(std::move(status));
  }
  // True once the receiver cancelled (an answer would be dropped).
  bool cancelled() const { return sink_ && sink_->cancelled(); }

  // The serializable address; registers the port with the current runtime
  // so an answer coming back from another proc finds it.
  PortAddress address() const { return sink_ ? sink_->port_address() : PortAddress{}; }
  std::string to_bytes() const { return address().to_bytes(); }
  static absl::StatusOr<OncePort> from_bytes(std::string_view bytes) {
    auto a = PortAddress::from_bytes(bytes);
    if (!a.ok()) return a.status();
    return OncePort(detail::make_remote_reply_sink(std::move(*a), type_id<T>()));
  }

 private:
  detail::ReplySink* sink_ = nullptr;
};

// A fresh one-shot port and the future it resolves.
template <typename T>
std::pair<OncePort<T>, Future<T>> make_once_port() {
  auto* state = new detail::FutureState<T>();
  OncePort<T> port(state);
  return {std::move(port), Future<T>(state)};
}

template <typename T>
class Port {
 public:
  Port() = default;
  // Prefer ActorRef<A>::port<T>(), which checks A handles T at compile time.
  explicit Port(UntypedRef target) : target_(std::move(target)) {}

  bool valid() const { return target_.valid(); }
  void send(T value) const { target_.tell(std::move(value)); }
  const UntypedRef& target() const { return target_; }
  PortAddress address() const { return PortAddress{target_.address(), 0}; }
  std::string to_bytes() const { return address().to_bytes(); }
  static absl::StatusOr<Port> from_bytes(std::string_view bytes) {
    auto a = PortAddress::from_bytes(bytes);
    if (!a.ok()) return a.status();
    if (a->port != 0) return absl::InvalidArgumentError("Port<T> address must name an actor mailbox (#0)");
    return Port(UntypedRef::from_address(std::move(a->owner)));
  }

  friend bool operator==(const Port& a, const Port& b) { return a.target_ == b.target_; }

 private:
  UntypedRef target_;
};

}  // namespace castmesh
