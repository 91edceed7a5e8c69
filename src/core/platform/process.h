// Facts about this process that POSIX has no single call for: its own
// executable, its command line, its environment, and thread names.
// The platform choice for each is made in process.cc only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castmesh::platform {

// Records the command line given to castmesh::init (argv[0] is resolved to
// an absolute path now, against the current folder and PATH, since both
// may change later). Main thread, once at start-up, before any other thread
// calls the functions below.
void record_command_line(int argc, char** argv);

// The command line of this process: the one recorded by castmesh::init, else
// what the system reports (Linux /proc/self/cmdline, macOS _NSGetArgv);
// empty if neither is known. Any thread.
std::vector<std::string> command_line();

// A path that starts this same program again (posix_spawn): Linux
// /proc/self/exe (right even if the file was since replaced), macOS
// _NSGetExecutablePath, FreeBSD sysctl KERN_PROC_PATHNAME, otherwise argv[0]
// as recorded by castmesh::init. FailedPrecondition saying what to do when
// none is known. Any thread.
absl::StatusOr<std::string> executable_path();

// The environment (`environ`; macOS shared libraries must ask _NSGetEnviron).
// Read-only use; any thread, as long as nobody calls setenv meanwhile.
char** environment();

// Removes the variable `name` from this process's environment for good:
// its value is overwritten in place first (on Linux also in the block the
// process was started with, which /proc/<pid>/environ shows, even where
// unsetenv already dropped the pointer to it), then unsetenv. For secrets.
// Main thread, before other threads read the environment.
void erase_from_environment(const char* name);

// The open-file limit (RLIMIT_NOFILE) before and after raise_open_file_limit.
struct OpenFileLimit {
  std::uint64_t before = 0;
  std::uint64_t after = 0;
};

// Raises this process's soft open-file limit to its hard limit (capped at
// OPEN_MAX where the system defines one), once per process: every peer
// connection costs a descriptor, and Debian's default soft limit (1024)
// lets a flood of connections exhaust it. Later calls return the first
// result. Any thread.
OpenFileLimit raise_open_file_limit();

// Names the calling thread for debuggers and `top -H` (at most 15
// characters are kept). A no-op where the system has no such call.
void set_current_thread_name(const char* name);

// With `defers`, makes the calling thread stop preempting a running thread
// when it wakes: it then runs on a free core, or on a busy one at the
// scheduler's next tick (Linux SCHED_BATCH, same priority otherwise); for a
// thread whose wake-ups would take the core from a thread busy-waiting for
// the very event that woke it. Without, the default policy again. False
// where the system has no such policy. Calling thread only.
bool set_calling_thread_defers_on_wake(bool defers);

}  // namespace castmesh::platform
