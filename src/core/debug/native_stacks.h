// Native stacks of every thread of this process, taken while they run: each
// thread gets a real-time signal (tgkill) whose handler, on that thread,
// records its return addresses (backtrace()), its pthread id and what it
// runs (core/actor/running_now.h) into a preallocated slot, then posts a
// semaphore. Only async-signal-safe work happens in the handler; names and
// symbols are looked up afterwards (symbolizer.h). A thread that does not
// answer within the bound (it blocks the signal, it is stopped, it sits in
// an uninterruptible kernel wait) is reported as not answering, and a late
// answer can never write into a later capture's memory.
//
// Linux only (/proc/self/task, tgkill); elsewhere capture_native_stacks
// returns Unimplemented.
//
// Threading: capture_native_stacks is thread-safe (captures are serialised
// by a process-wide lock) and blocks its caller for at most `timeout`
// (plus the bounded time a handler already running needs to finish).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/actor/running_now.h"

namespace castmesh::debug {

// One thread as captured. Plain value.
struct RawThreadStack {
  int64_t tid = 0;        // kernel thread id (gettid)
  std::string name;       // /proc/self/task/<tid>/comm
  bool answered = false;  // false: no answer within the bound (pcs and running are empty)
  uint64_t pthread_id = 0;  // pthread_self() of the thread, what Python calls its ident
  // pcs[0]: where the signal interrupted the thread; then return addresses,
  // innermost first (the handler's own frames are dropped).
  std::vector<uintptr_t> pcs;
  detail::RunningNow running;
};

// The signal used for the native capture (a real-time signal that castmesh
// reserves for this; docs/observability.md).
int native_stack_signal();

// Captures every thread of this process except the calling one. At most
// `timeout` waiting for answers. Fails if the signal's handler cannot be
// installed (another handler owns the signal) or off Linux.
//
// `while_stopped`, if given, runs on the calling thread while every thread
// that answered waits in the handler (at most a few seconds; then it goes
// on by itself): what must read other threads' memory without it changing
// underneath (Python's faulthandler walks every thread's frames). It must
// not allocate or take locks another thread may hold, since those threads
// are stopped wherever the signal found them.
absl::StatusOr<std::vector<RawThreadStack>> capture_native_stacks(absl::Duration timeout,
                                                                  const std::function<void()>& while_stopped = {});

}  // namespace castmesh::debug
