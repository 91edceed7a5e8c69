#include "core/platform/process.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/platform/platform.h"

#if !CASTMESH_LINUX_FACILITIES && defined(__APPLE__)
#include <crt_externs.h>
#include <mach-o/dyld.h>
#elif !CASTMESH_LINUX_FACILITIES && defined(__FreeBSD__)
#include <pthread_np.h>
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#if !defined(__APPLE__)
extern char** environ;
#endif

namespace castmesh::platform {
namespace {

struct RecordedCommandLine {
  std::vector<std::string> argv;
  std::string executable;  // argv[0] resolved at record time; empty if unknown
};

RecordedCommandLine& recorded() {
  static auto* r = new RecordedCommandLine;  // never destroyed: read on exit paths
  return *r;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// argv[0] as an absolute path: as given when it holds a '/', else the
// first executable match in PATH (what a shell does). Empty if not found.
std::string resolve_argv0(const std::string& argv0) {
  if (argv0.empty()) return "";
  std::string candidate;
  if (argv0.find('/') != std::string::npos) {
    candidate = argv0;
  } else {
    const char* path = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
      std::string c = absl::StrCat(dir.empty() ? absl::string_view(".") : dir, "/", argv0);
      if (is_executable_file(c)) {
        candidate = std::move(c);
        break;
      }
    }
  }
  if (candidate.empty()) return "";
  char resolved[PATH_MAX];
  if (::realpath(candidate.c_str(), resolved) == nullptr || !is_executable_file(resolved)) return "";
  return resolved;
}

}  // namespace

bool uses_linux_facilities() { return CASTMESH_LINUX_FACILITIES != 0; }

void record_command_line(int argc, char** argv) {
  RecordedCommandLine& r = recorded();
  r.argv.assign(argv, argv + argc);
  r.executable = argc > 0 ? resolve_argv0(argv[0]) : "";
}

std::vector<std::string> command_line() {
  if (!recorded().argv.empty()) return recorded().argv;
  std::vector<std::string> argv;
#if CASTMESH_LINUX_FACILITIES
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(cmdline, arg, '\0')) argv.push_back(arg);
#elif defined(__APPLE__)
  const int argc = *_NSGetArgc();
  char** args = *_NSGetArgv();
  for (int i = 0; i < argc; ++i) argv.emplace_back(args[i]);
#endif
  return argv;
}

absl::StatusOr<std::string> executable_path() {
#if CASTMESH_LINUX_FACILITIES
  return std::string("/proc/self/exe");
#else
#if defined(__APPLE__)
  uint32_t size = PATH_MAX;
  std::string path(size, '\0');
  if (_NSGetExecutablePath(path.data(), &size) != 0) {
    path.resize(size);
    if (_NSGetExecutablePath(path.data(), &size) != 0) path.clear();
  }
  path.resize(path.find('\0') == std::string::npos ? path.size() : path.find('\0'));
  char resolved[PATH_MAX];
  if (!path.empty() && ::realpath(path.c_str(), resolved) != nullptr) return std::string(resolved);
#elif defined(__FreeBSD__)
  int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PATHNAME, -1};
  char buffer[PATH_MAX];
  size_t size = sizeof(buffer);
  if (::sysctl(mib, 4, buffer, &size, nullptr, 0) == 0 && size > 1) return std::string(buffer);
#endif
  if (!recorded().executable.empty()) return recorded().executable;
  if (recorded().argv.empty()) {
    return absl::FailedPreconditionError(
        "cannot tell which program to start as a worker: this system has no way to ask for the running "
        "executable, and castmesh::init(argc, argv) was not called; call it at the start of main(), or set "
        "LocalAllocatorOptions::worker_argv");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot tell which program to start as a worker: argv[0] '", recorded().argv[0],
      "' (given to castmesh::init) is not an executable file, nor found in PATH; start the program by its path, "
      "or set LocalAllocatorOptions::worker_argv"));
#endif
}

char** environment() {
#if defined(__APPLE__)
  return *_NSGetEnviron();
#else
  return environ;
#endif
}

namespace {

// Overwrites the value of every "name=value" entry in [begin, end), a block
// of NUL-separated entries, with NUL bytes.
void blank_entries(char* begin, char* end, std::string_view name) {
  for (char* entry = begin; entry < end;) {
    const std::size_t length = ::strnlen(entry, static_cast<std::size_t>(end - entry));
    const std::string_view text(entry, length);
    if (text.size() > name.size() && text.starts_with(name) && text[name.size()] == '=') {
      std::memset(entry + name.size() + 1, 0, length - name.size() - 1);
    }
    entry += length + 1;
  }
}

#if CASTMESH_LINUX_FACILITIES
// The environment block this process was started with ([env_start,
// env_end) of /proc/self/stat, fields 50 and 51, Linux >= 3.5).
std::pair<char*, char*> initial_environment_block() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return {nullptr, nullptr};
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state): field N is fields[N - 3].
  unsigned long long start = 0, end = 0;
  if (fields.size() < 49 || !absl::SimpleAtoi(fields[47], &start) || !absl::SimpleAtoi(fields[48], &end) ||
      start == 0 || end <= start) {
    return {nullptr, nullptr};
  }
  return {reinterpret_cast<char*>(start), reinterpret_cast<char*>(end)};
}
#endif

}  // namespace

void erase_from_environment(const char* name) {
  const std::string_view key(name);
  for (char** e = environment(); *e != nullptr; ++e) {
    const std::size_t length = std::strlen(*e);
    blank_entries(*e, *e + length, key);
  }
#if CASTMESH_LINUX_FACILITIES
  if (auto [begin, end] = initial_environment_block(); begin != nullptr) blank_entries(begin, end, key);
#endif
  ::unsetenv(name);
}

OpenFileLimit raise_open_file_limit() {
  static const OpenFileLimit result = [] {
    OpenFileLimit limit;
    rlimit current{};
    if (::getrlimit(RLIMIT_NOFILE, &current) != 0) return limit;
    limit.before = limit.after = current.rlim_cur;
    rlim_t wanted = current.rlim_max;
#if defined(OPEN_MAX)
    // macOS refuses RLIM_INFINITY (and anything above OPEN_MAX) here.
    if (wanted == RLIM_INFINITY || wanted > static_cast<rlim_t>(OPEN_MAX)) wanted = OPEN_MAX;
#endif
    if (wanted <= current.rlim_cur) return limit;
    rlimit raised = current;
    raised.rlim_cur = wanted;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit.after = wanted;
    return limit;
  }();
  return result;
}

void set_current_thread_name(const char* name) {
  char truncated[16] = {};
  for (size_t i = 0; i + 1 < sizeof(truncated) && name[i] != '\0'; ++i) truncated[i] = name[i];
#if CASTMESH_LINUX_FACILITIES
  ::pthread_setname_np(::pthread_self(), truncated);
#elif defined(__APPLE__)
  ::pthread_setname_np(truncated);  // macOS names only the calling thread
#elif defined(__FreeBSD__)
  ::pthread_set_name_np(::pthread_self(), truncated);
#else
  (void)truncated;  // no portable call: the thread stays unnamed
#endif
}

bool set_calling_thread_defers_on_wake(bool defers) {
#if CASTMESH_LINUX_FACILITIES
  const sched_param param{};  // neither policy has a static priority
  return ::pthread_setschedparam(::pthread_self(), defers ? SCHED_BATCH : SCHED_OTHER, &param) == 0;
#else
  (void)defers;
  return false;  // POSIX has no class that only forgoes wake-up preemption
#endif
}

}  // namespace castmesh::platform
