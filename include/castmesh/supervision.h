// Failure and stop notifications.
//
// Every actor has a parent (the actor that spawned it, or the runtime's root
// for Runtime::spawn). A handler that throws stops its actor; the parent gets
// a SupervisionEvent inside its Actor::on_child_failed. Returning false there
// (the default) escalates: the parent stops with a reason naming the child,
// and its own parent gets an event. The root reports unhandled events to
// RuntimeOptions::on_unhandled_failure and the log.
// Monitors (Actor::monitor, Runtime::monitor) get a DownEvent when the
// watched actor stops for any reason.
#pragma once

#include <absl/status/status.h>

#include <string>

#include "castmesh/address.h"

namespace castmesh {

// A child actor failed (its handler threw, or it escalated a failure).
struct SupervisionEvent {
  Address child;             // the actor that stopped
  absl::Status reason;       // why (never OK)
  std::string message_type;  // C++ name of the message it was handling ("" if none)
  Address origin;            // the actor whose failure started the chain (== child when direct)

  std::string to_string() const;
};

// A monitored actor stopped. `reason` is OK for a normal stop. For an actor
// of another proc the event comes from that proc (the actor stopped or was
// never there: kNotFound) or from the loss of the proc itself (kUnavailable
// naming the proc); each monitor gets exactly one DownEvent.
struct DownEvent {
  Address actor;
  absl::Status reason;
  // C++ name of the message it was handling when it failed ("" if none,
  // or not known).
  std::string message_type{};
};

}  // namespace castmesh
