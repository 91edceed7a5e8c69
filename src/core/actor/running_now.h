// What the calling thread is running right now (an actor, a message), for
// stack dumps (core/debug). The actor layer keeps it in two thread-locals
// that a turn sets anyway (the cell) or sets with one store per message
// (the envelope); read_running_now copies them into fixed storage from a
// signal handler on that very thread, so it must stay async-signal-safe:
// no allocation, no locks, plain loads and copies only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace castmesh::detail {

struct RunningNow {
  bool in_actor = false;    // a turn of an actor runs on this thread
  bool in_message = false;  // ... and it is inside a message's handler
  uint32_t message_type = 0;  // castmesh::type_name_of(message_type) names it (when in_message)
  uint64_t actor_index = 0;
  size_t actor_name_size = 0;   // bytes of the actor's name (may exceed what fits below)
  char actor_name[128] = {};    // its first bytes, not terminated
  size_t class_name_size = 0;
  char class_name[96] = {};     // the actor's C++ class (first bytes, not terminated)
};

// Fills `out` for the calling thread. Async-signal-safe: called from a
// signal handler that interrupted the thread, whose cell and envelope are
// alive until the thread itself moves on.
void read_running_now(RunningNow* out) noexcept;

}  // namespace castmesh::detail
