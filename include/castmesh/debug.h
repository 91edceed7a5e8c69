// Stack dumps of running procs (docs/observability.md, "Stack dumps").
//
//  * castmesh::debug::stacks(proc_mesh, timeout): for every proc of the
//    mesh, every thread's native stack (symbolised), its Python stack when
//    the proc runs Python, and the actor and message a worker thread is
//    running right now. Works while a thread is stuck in C code, with or
//    without Python's GIL: nothing in the dump needs the GIL or the stuck
//    thread's cooperation, and a thread that cannot answer (it blocks the
//    dump's signal, it is stopped) is reported as such within the bound.
//  * castmesh::debug::this_process_stacks(): the same for the calling
//    process (its other threads).
//  * to_string(): the dump as text, one block per proc and thread.
//
// Threading: every function may be called from any thread; they block
// their caller for at most about the timeout (plus the symbol lookup).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <string>
#include <vector>

#include "castmesh/proc_mesh.h"

namespace castmesh::debug {

// One native frame. Plain value.
struct NativeFrame {
  uint64_t pc = 0;       // the address in the running process
  std::string function;  // demangled; empty: unknown
  std::string object;    // the executable or shared object it is in
  uint64_t offset = 0;   // pc relative to the object's load base
  std::string file;      // source file and line (addr2line); empty/0: unknown
  int line = 0;
};

// One Python frame. Plain value.
struct PythonFrame {
  std::string file;
  int line = 0;  // 0: unknown
  std::string function;
};

// One thread of a proc. Plain value.
struct ThreadStack {
  int64_t tid = 0;        // kernel thread id
  std::string name;       // the thread's name (/proc/<pid>/task/<tid>/comm)
  bool answered = false;  // false: it did not answer within the bound (native is empty)
  std::vector<NativeFrame> native;  // innermost first
  bool has_python = false;          // the thread runs Python (python may still be empty)
  std::vector<PythonFrame> python;  // innermost first
  bool python_truncated = false;    // Python's dump stopped early (very deep stack)
  std::string actor;         // the actor running on it now, "name[index]"; empty: none
  std::string actor_class;   // that actor's C++ class
  std::string message_type;  // the message whose handler runs now; empty: none
};

// One proc's dump. Plain value.
struct ProcStacks {
  ProcInfo proc;       // empty id for this_process_stacks()
  absl::Status status;  // not ok: the proc did not answer (threads empty)
  int64_t pid = 0;
  std::vector<ThreadStack> threads;
  std::string python_error;  // why Python stacks are missing in a Python proc; usually empty
};

// What to dump and how long to wait. Plain value.
struct StackOptions {
  // How long a proc waits for its threads to answer; the whole call waits
  // for a proc's reply about twice this plus the symbol lookup.
  absl::Duration timeout = absl::Seconds(2);
  // Source file and line of native frames (runs binutils' addr2line, when
  // on PATH, in each proc for up to `symbol_budget`).
  bool file_lines = true;
  absl::Duration symbol_budget = absl::Seconds(10);
};

// Every proc of `mesh` (in its order), asked in parallel. A proc that does
// not answer gets a status (never a hang). Fails only on bad arguments
// (a mesh whose runtime is not a proc).
absl::StatusOr<std::vector<ProcStacks>> stacks(const ProcMesh& mesh, StackOptions options);
absl::StatusOr<std::vector<ProcStacks>> stacks(const ProcMesh& mesh, absl::Duration timeout);
// This process's threads (all but the caller).
ProcStacks this_process_stacks(StackOptions options = {});

// The dump as text (docs/observability.md shows it).
std::string to_string(const ProcStacks& proc);
std::string to_string(const std::vector<ProcStacks>& procs);

// The real-time signal a dump sends every thread (SIGRTMIN+5 on Linux; 0
// elsewhere). Code that blocks signals wholesale in a thread should leave
// it unblocked, or the thread shows as not answering.
int stack_signal();

// For a language binding that embeds Python (the castmesh package): the
// signal and file descriptor for `faulthandler.register(signal, file=fd,
// all_threads=True, chain=False)`, and the call that says it is done
// (before it, dumps leave Python out). Linux; Unimplemented elsewhere.
struct PythonStackHook {
  int signal = 0;
  int fd = -1;
};
absl::StatusOr<PythonStackHook> python_stack_hook();
void python_stack_hook_ready();
// The binding counts Python threads from their start until they run Python
// code (+1, then -1): no Python dump is taken meanwhile (CPython 3.11's
// faulthandler crashes on a thread state that is not initialised yet).
void python_thread_starting(int delta);

}  // namespace castmesh::debug
