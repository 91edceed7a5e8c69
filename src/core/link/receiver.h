// Receiver: where every link delivers what arrives, the matching layer above
// the links (collectives' Exchange registers itself when the library loads,
// core/collectives/exchange.cc). The links sit below the collectives and so
// reach it only through this seam: a ring consumer, the in-process link and
// a lost peer's teardown call it, never the collectives' headers.
//
// Also the ProcHost data message types that the frame links send and the
// collectives' proc service receives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "castmesh/address.h"
#include "core/wire/payload.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::link {

struct Envelope;

// The ProcHost data message type of communicator frames.
inline constexpr char kCollectiveDataType[] = "castmesh.collectives.v1";
// The type of the shared-memory link handshake (CHANNEL_LINK_*), which only
// the I/O thread handles: a waiter tells it from the frame header alone.
inline constexpr char kCollectiveLinkDataType[] = "castmesh.collectives.link.v1";

// The receiving matching layer. Its methods run on whichever thread delivers
// (a ring consumer, a sender in this process, an I/O thread).
class Receiver {
 public:
  virtual ~Receiver() = default;
  // A data message whose body `body[0, size)` is read before this returns.
  virtual void on_compact(const Envelope& message, const char* body, size_t size) = 0;
  // A frame from proc `peer` to proc `host` whose body is `body[0, size)`,
  // owned by `owner` when not empty (else read before this returns).
  virtual void on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header,
                        const char* body, size_t size, wire::Payload owner) = 0;
  // Collective `sequence` of rank `dest` of communicator `comm` in this
  // process is aborted by its sender.
  virtual void abort_collective(std::string_view comm, int dest, uint64_t sequence, const absl::Status& why) = 0;
  // Proc `peer` is lost (a link found it gone or its ring broken).
  virtual void on_peer_lost(const ProcId& peer, const absl::Status& why) = 0;
};

// Registers the receiver (once, before any link delivers; it is never
// freed). Any thread.
void set_receiver(Receiver* receiver);
// The registered receiver; one that drops what it gets and logs an error
// when none is registered (a library built without the collectives). Any thread.
Receiver& receiver();

}  // namespace castmesh::link
