// SocketWait: a thread that waits on a communicator request reads its
// peers' sockets itself, so a message that comes over TCP (across hosts,
// or with shared memory off) reaches the waiting caller without waking the
// proc's I/O thread first and the caller second (transport::PeerReader).
//
// Which sockets: every connection that has delivered a communicator data
// frame (Exchange::on_frame calls watch_socket_peer); each is read by the
// waiting thread through a PeerReader that takes only communicator data
// frames (point-to-point, collective steps, aborts, single-copy answers),
// large bodies included (read straight into the posted receive, taking
// turns with the I/O thread); any other frame stays with the I/O thread.
//
// How a caller waits (the progress engine's second wait source, after the
// shared-memory rings: core/progress/progress_engine.h): it reads every
// watched socket, spinning up to CASTMESH_SOCKET_SPIN_US microseconds
// (default 200) under the engine's wait policy (it gives its core away
// between looks when procs of this host outnumber its cores or its core is
// contended; after 4 spins in a row that did not end their wait, as on a
// host whose cores are all busy, waiters skip the spin and try it again one
// wait in 64), then
// sleeps in poll() on those sockets and on an eventfd that the request's
// completion writes (a message that came another way, a failure), reading
// the sockets again each time it wakes. A frame the I/O thread reads first
// is delivered by it as before: nothing depends on who reads.
//
// While it spins, the waiter also writes what its watched connections have
// queued beyond what their senders wrote at once (the rest of a large
// message that filled the socket: PeerReader::push), instead of leaving it
// to the I/O thread.
//
// A waiter about to spin also makes its proc's I/O thread stop preempting
// running threads when it wakes (PeerReader::defer_io_thread), until no
// waiter has spun for a heartbeat interval: with every core running a
// caller that spins for its peer's message, the I/O thread woken by that
// message's arrival took a core from one of them (it preempted the sender,
// or the very waiter about to read the message), which doubled
// small-message latency over TCP (bench/RESULTS.md). It then runs when a
// core is free or at the next scheduler tick.
// CASTMESH_SOCKET_IO_DEFER=0 keeps the I/O thread preempting.
//
// CASTMESH_SOCKET_WAIT=0 turns it all off (the I/O thread reads everything).
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "castmesh/address.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::collectives {

// From Exchange::on_frame, on the thread that delivers a socket frame of
// `peer` through `host`: waiting threads read that frame's connection from
// now on (at once when it is already watched).
void watch_socket_peer(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer);

// Counters for tests and benchmarks.
struct SocketWaitStats {
  uint64_t waiter_reads = 0;   // reads by a waiting caller that delivered frames itself
  uint64_t waiter_sleeps = 0;  // times a waiting caller slept in poll()
  int watched = 0;             // connections watched now
};
SocketWaitStats socket_wait_stats();

}  // namespace castmesh::collectives
