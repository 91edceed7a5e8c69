// One process's stack dump, put together: the native capture
// (native_stacks.h), symbols (symbolizer.h), the Python stacks
// (python_stacks.h) matched to their threads by pthread id, and the
// actor/message each thread runs. Also the conversions between the wire
// form (StackDumpReply) and the public one (castmesh/debug.h).
//
// Threading: thread-safe; dump_this_process blocks its caller up to
// thread_timeout + symbol_budget.
#pragma once

#include "absl/time/time.h"
#include "castmesh/debug.h"
#include "castmesh/wire/v1/debug.pb.h"

namespace castmesh::debug {

// Every thread of this process but the caller's.
wire::v1::StackDumpReply dump_this_process(absl::Duration thread_timeout, absl::Duration symbol_budget);

// The wire form's threads (and error) in the public form.
ProcStacks from_wire(const wire::v1::StackDumpReply& reply);

}  // namespace castmesh::debug
