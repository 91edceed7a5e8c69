// The transport's entry points into a Runtime: internal, not user API.
//
// A Runtime becomes a proc of a mesh through this seam only (the proc
// layer's ProcHost and cast relay use it; so do the tests of the seam):
//  * set_proc_id() (public, on Runtime) names this proc before the first spawn.
//  * Sends to an address of another proc are encoded with the message type's
//    codec and handed to the RemoteRouter as a WireMessage.
//  * The transport injects incoming messages with deliver_wire() (or
//    deliver_serialized / deliver_serialized_reply / fail_reply_port).
//  * fail_pending_to_proc(), report_remote_down(), report_proc_down() and
//    deliver_supervision_event() report dead procs and actors.
// docs/actors.md describes the contract.
#pragma once

#include <absl/status/status.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "castmesh/address.h"
#include "castmesh/runtime.h"
#include "castmesh/supervision.h"

namespace castmesh::detail {

class RuntimeCore;

// One message crossing procs, in either direction. For a message to an
// actor `port` is 0; for an answer, `port` names the reply port on
// `destination.proc` and a non-OK `error` means the request failed.
struct WireMessage {
  Address destination;
  uint64_t port = 0;
  Address sender;                        // empty when not sent by an actor
  std::string type_name;                 // the codec's wire name
  std::string payload;                   // codec bytes
  std::optional<PortAddress> reply_to;   // requests: where the answer goes
  absl::Status error;                    // answers only
};

// Carries messages to other procs. Implemented by the transport and
// installed with RuntimeTransportSeam::set_remote_router. Called on the
// sending thread (any thread, including actor handlers); must not block for
// long. It may call back into the runtime (e.g. deliver_wire for a loopback).
class RemoteRouter {
 public:
  virtual ~RemoteRouter() = default;
  // Sends `msg` to msg.destination.proc. Delivery failures are reported
  // back later through fail_reply_port / fail_pending_to_proc.
  virtual void route(WireMessage msg) = 0;
  // Monitors of the remote actor `actor` started: the transport must call
  // report_remote_down when it stops (or is not there), or report_proc_down
  // when its proc is lost. Called once per actor until it was reported down
  // (later monitors of it share that report).
  virtual void watch(const Address& actor) {}
};

// The seam itself: static entry points taking the Runtime (a friend of
// Runtime). Thread-safe like the Runtime; any thread unless noted.
class RuntimeTransportSeam {
 public:
  // The runtime's internal state (reply ports, for the cast relay). Inline:
  // the relay asks for it on every hop.
  static RuntimeCore* core(const Runtime& runtime) { return runtime.core_.get(); }
  // Installs the router for addresses of other procs (nullptr removes it).
  static void set_remote_router(Runtime& runtime, std::shared_ptr<RemoteRouter> router);
  // Incoming message from the transport (actor message or answer).
  static absl::Status deliver_wire(Runtime& runtime, WireMessage msg);
  // Injects a serialized message for the local actor `destination`.
  // Errors: kNotFound (no such actor; an answer to reply_to is sent as
  // well), kUnimplemented (unknown wire type name), kInvalidArgument
  // (undecodable payload). `may_run_here`: the caller is a transport thread
  // outside any actor that may run the message's handler itself when the
  // actor is idle and its class declares kShortHandlers (castmesh/actor.h).
  static absl::Status deliver_serialized(Runtime& runtime, const Address& destination, std::string_view type_name,
                                         std::string_view bytes,
                                         const std::optional<PortAddress>& reply_to = std::nullopt,
                                         const Address& sender = {}, bool may_run_here = false);
  // Injects the answer for a reply port of this proc.
  static absl::Status deliver_serialized_reply(Runtime& runtime, const PortAddress& port, std::string_view type_name,
                                               std::string_view bytes);
  // Fails the request waiting on a reply port of this proc.
  static void fail_reply_port(Runtime& runtime, const PortAddress& port, absl::Status error);
  // Fails every request waiting for an answer from `proc` (it died).
  static void fail_pending_to_proc(Runtime& runtime, const ProcId& proc, absl::Status error);
  // A remote actor stopped (`message_type`: what it was handling when it
  // failed, if known): monitors of it get a DownEvent. Each monitor of a
  // remote actor is told once, by this or report_proc_down, whichever comes
  // first; the callbacks run on the runtime's timer thread, never on the
  // caller's (the transport's I/O thread).
  static void report_remote_down(Runtime& runtime, const Address& actor, absl::Status reason,
                                 std::string message_type = {});
  // A proc died: fail_pending_to_proc, and every monitored actor there is down.
  static void report_proc_down(Runtime& runtime, const ProcId& proc, absl::Status reason);
  // A failure event for the local actor `parent` (e.g. its remote child
  // failed); handled like a local child's failure.
  static absl::Status deliver_supervision_event(Runtime& runtime, const Address& parent, SupervisionEvent event);
};

}  // namespace castmesh::detail
