// Internal: what an actor address resolves to at send time. A local actor's
// cell, a remote actor (delivered through the RemoteRouter), or an address
// not resolved yet (resolved through the current runtime on each send).
#pragma once

#include <memory>

#include "castmesh/address.h"
#include "castmesh/detail/envelope.h"

namespace castmesh::detail {

class RuntimeCore;

class Destination {
 public:
  explicit Destination(Address address) : address_(std::move(address)) {}
  Destination(const Destination&) = delete;
  Destination& operator=(const Destination&) = delete;
  virtual ~Destination() = default;

  const Address& address() const { return address_; }
  // Takes ownership of `env`. If it cannot be delivered, its request (if
  // any) fails with an error naming this address, and it is deleted.
  // Any thread.
  virtual void deliver(Envelope* env) = 0;
  // Class id (type_id<A>()) of a local actor; 0 when not known here.
  virtual uint32_t actor_class() const { return 0; }
  // The runtime this destination belongs to, or nullptr (unresolved).
  virtual RuntimeCore* runtime() const { return nullptr; }

 private:
  Address address_;
};

// A destination resolved lazily through Runtime::current() at each send.
std::shared_ptr<Destination> unresolved_destination(Address address);
// Fails `env`'s request with `status` and deletes it.
void reject(Envelope* env, absl::Status status);
// Posts a closure envelope to `target` (dropped if the actor is gone).
void post(Destination& target, Envelope* closure);
// Requests that the actor stops after the messages already in its mailbox.
void request_stop(Destination& target);

}  // namespace castmesh::detail
