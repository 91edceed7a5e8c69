// The process's trace recorder: what recording sites call (handler runs,
// sends and receives, collectives, RDMA, user spans) and what the trace
// service reads. Each thread records into its own ring of fixed-size
// records: the owning thread is the only writer (relaxed stores of whole
// words, then a release store of the ring's head), so recording takes no
// lock and allocates only at a thread's first record; a reader copies the
// newest records and discards any a late writer may have overwritten
// meanwhile. Names are interned once into small ids.
//
// Threading: every function may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace castmesh::trace {

// What a record is about (a trace event's category).
enum class Category : uint8_t {
  kHandler = 1,     // an actor's handler run
  kSend = 2,        // a message leaving for another proc
  kReceive = 3,     // a message from another proc, on the I/O thread
  kCast = 4,        // a cast-tree hop
  kSpawn = 5,       // spawning procs or actors
  kSupervision = 6, // a failure reported or handled
  kCollective = 7,  // a collective call or one of its steps
  kRdma = 8,        // an RDMA buffer operation
  kUser = 9,        // castmesh.span / traced / trace::Span
};
// The category's name in the trace ("handler", "send", ...).
std::string_view category_name(Category category);

// How a record is drawn.
enum class RecordKind : uint8_t {
  kSlice = 1,     // [start, start + duration) on its thread
  kFlowOut = 2,   // an arrow leaves here (inside the slice around it)
  kFlowIn = 3,    // the arrow with the same flow id ends here (binds to the slice that encloses it)
  kInstant = 4,   // a point in time
  kAsyncBegin = 5,  // an operation that may end on another thread begins (its id in `flow`)
  kAsyncEnd = 6,    // ... and ends (same id; drawn on the process's async track)
};

// One record. Plain value (32 + 16 bytes).
struct Record {
  int64_t start_ns = 0;     // monotonic clock of this process (now_ns)
  int64_t duration_ns = 0;  // slices only
  uint64_t flow = 0;        // flow id (kFlowOut/kFlowIn), or 0
  uint64_t value = 0;       // a number shown as the event's "value" arg (bytes, queue wait ns...), or 0
  uint32_t name = 0;        // interned name
  uint32_t detail = 0;      // interned second text shown as "detail" (actor, path, peer), or 0
  Category category = Category::kUser;
  RecordKind kind = RecordKind::kSlice;
};

namespace internal {
extern std::atomic<bool> g_recording;
}  // namespace internal

// Whether this process records now: one relaxed load, the check every
// recording site makes first.
inline bool on() { return internal::g_recording.load(std::memory_order_relaxed); }

// Turns recording on or off in this process; `ring_records` (on only) is
// the capacity of rings made from now on (threads that already have one keep
// theirs). Turning on again after off starts from empty rings.
void set_recording(bool on, uint64_t ring_records);

// The clock records use: CLOCK_MONOTONIC in nanoseconds.
int64_t now_ns();

// The id of `text` (the same text always gets the same id; 0 is "no text").
// Takes a lock and may allocate the first time a text is seen: recording
// sites cache ids of fixed names (static locals) and of per-type names.
uint32_t intern(std::string_view text);

// intern() through a per-thread cache: after a thread's first use of a
// text, no lock (what recording sites with per-message names use).
uint32_t intern_cached(std::string_view text);

// A new flow id, unique across the procs of a trace (a random per-process
// prefix and a counter).
uint64_t new_flow_id();

// The flow id of the cross-proc message the calling thread is delivering
// now (set by the proc layer around a delivery, read where the message's
// envelope is made), or 0.
// take_inbound_flow() returns it and clears it (one envelope takes it).
void set_inbound_flow(uint64_t flow);
uint64_t take_inbound_flow();

// The name of the handler the calling thread runs now, for its handler
// slice, when the message type does not say it: a handler that serves many
// endpoints (the Python actor server) sets it while recording; the actor
// layer takes it (and clears it) when the handler returns. 0: none.
void name_current_handler(uint32_t name);
uint32_t take_handler_name();

// Records one record on the calling thread (nothing when not on()).
void record(const Record& record);

// Convenience forms of record().
inline void slice(Category category, uint32_t name, int64_t start_ns, int64_t end_ns, uint64_t value = 0,
                  uint32_t detail = 0) {
  record(Record{start_ns, end_ns - start_ns, 0, value, name, detail, category, RecordKind::kSlice});
}
inline void instant(Category category, uint32_t name, int64_t at_ns, uint64_t value = 0, uint32_t detail = 0) {
  record(Record{at_ns, 0, 0, value, name, detail, category, RecordKind::kInstant});
}
inline void flow(Category category, RecordKind kind, uint32_t name, uint64_t flow_id, int64_t at_ns) {
  record(Record{at_ns, 0, flow_id, 0, name, 0, category, kind});
}

// The records of one thread, oldest first, as a reader copied them.
struct ThreadRecords {
  pid_t tid = 0;
  std::string name;          // the thread's name (its comm) when it made its ring, or now if it still runs
  std::vector<Record> records;
  uint64_t dropped = 0;      // records overwritten before they were read
};

// Copies every thread's records (threads that ended included) and empties
// the rings. Safe while threads still record: a record written during the
// copy lands in the next take.
std::vector<ThreadRecords> take_records();

// Every interned text, indexed by id (entry 0 is "").
std::vector<std::string> interned_texts();

}  // namespace castmesh::trace
