// Python stacks of every thread of this process, without the GIL: the
// process's Python side registers faulthandler for a real-time signal
// (`faulthandler.register(signal, file=fd, all_threads=True, chain=False)`,
// python/castmesh/debug.py) writing into a memory file that this module
// owns; raise_python_dump raises that signal on the calling thread, whose
// handler walks every interpreter thread's frames without taking the GIL
// (so it works while a thread holds the GIL in C code), and reads the text
// back. parse_python_stacks splits the text per thread.
//
// Threading: all functions are thread-safe; dumps are serialised.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace castmesh::debug {

// Where the Python side registers its faulthandler: the signal and the
// file descriptor (a memory file, created on the first call).
struct PythonDumpTarget {
  int signal = 0;
  int fd = -1;
};
absl::StatusOr<PythonDumpTarget> python_dump_target();
// Called by the Python side once faulthandler is registered for the target
// (before that, raise_python_dump raises nothing: the signal's default
// action would end the process).
void set_python_dump_ready();
// Whether set_python_dump_ready was called in this process.
bool python_dump_ready();
// Counts Python threads between their start and their first Python code
// (+1 / -1; the Python side wraps _thread.start_new_thread). CPython 3.11
// links a new thread's state before it is initialised, and faulthandler
// crashes on it, so raise_python_dump does not run while one is starting.
void note_python_thread_starting(int delta);

// faulthandler's text for every Python thread, in two steps: raise writes
// it (while the other threads are held still: native_stacks.h's
// while_stopped; it allocates nothing and takes no lock that another
// thread could hold), read returns it. Returns false when nothing was
// raised (no Python side registered, a Python thread is starting, or the
// dump file failed).
// Serialised by the caller (one capture at a time).
bool raise_python_dump() noexcept;
// What the last raise_python_dump wrote; NotFound when this process has no
// Python side registered.
absl::StatusOr<std::string> read_python_dump();

// One Python thread of faulthandler's text.
struct PythonThread {
  uint64_t ident = 0;  // threading.get_ident(): the thread's pthread_self()
  struct Frame {
    std::string file;
    int line = 0;  // 0: unknown
    std::string function;
  };
  std::vector<Frame> frames;  // innermost first, as faulthandler writes them
  bool truncated = false;     // faulthandler stopped early ("...")
};
// Splits faulthandler's all-threads text ("Thread 0x...:" blocks); lines it
// does not know are skipped.
std::vector<PythonThread> parse_python_stacks(std::string_view text);

}  // namespace castmesh::debug
