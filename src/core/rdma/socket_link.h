// The socket link of RDMA buffers: operations as messages over the procs'
// connection, the path every owner offers. A read sends READ and the owner
// answers with READ_DATA chunks sent straight from its registered memory,
// received in place into the destination (read_sink.h, a link::BodySink);
// a write sends WRITE_DATA chunks that the owner receives in place into the
// registered memory (incoming_writes.h) and answers WRITE_DONE; a release
// sends RELEASE. Also where other links hand a transfer on when their own
// path is refused (the last route).
//
// Thread-safe.
#pragma once

#include "core/link/link.h"

namespace castmesh::rdma {

// The process's socket link (leaked: answers may arrive during exit).
link::Link& socket_link();

}  // namespace castmesh::rdma
