#include "core/debug/python_stacks.h"

#include <atomic>
#include <cerrno>
#include <csignal>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace castmesh::debug {
namespace {

std::atomic<bool> g_ready{false};
std::atomic<int> g_threads_starting{0};

}  // namespace

#if defined(__linux__)

absl::StatusOr<PythonDumpTarget> python_dump_target() {
  static const int fd = memfd_create("castmesh-python-stacks", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError("memfd_create failed for Python stack dumps");
  return PythonDumpTarget{SIGRTMIN + 6, fd};
}

bool raise_python_dump() noexcept {
  if (!g_ready.load(std::memory_order_acquire)) return false;
  if (g_threads_starting.load(std::memory_order_acquire) > 0) return false;
  absl::StatusOr<PythonDumpTarget> target = python_dump_target();  // created at registration: no allocation
  if (!target.ok()) return false;
  if (ftruncate(target->fd, 0) != 0 || lseek(target->fd, 0, SEEK_SET) != 0) return false;
  // A signal a thread sends itself is handled before the call returns, so
  // the text is complete when raise() returns. The signal must not be
  // blocked on this thread.
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, target->signal);
  sigset_t before;
  pthread_sigmask(SIG_UNBLOCK, &only, &before);
  raise(target->signal);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return true;
}

absl::StatusOr<std::string> read_python_dump() {
  if (!g_ready.load(std::memory_order_acquire)) {
    return absl::NotFoundError("no Python interpreter registered for stack dumps in this process");
  }
  absl::StatusOr<PythonDumpTarget> target = python_dump_target();
  if (!target.ok()) return target.status();
  struct stat st {};
  if (fstat(target->fd, &st) != 0) return absl::InternalError("cannot read the Python stack dump file");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = pread(target->fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

#else

absl::StatusOr<PythonDumpTarget> python_dump_target() {
  return absl::UnimplementedError("Python stack dumps through castmesh need Linux (memfd_create)");
}

bool raise_python_dump() noexcept { return false; }

absl::StatusOr<std::string> read_python_dump() {
  return absl::UnimplementedError("Python stack dumps through castmesh need Linux (memfd_create)");
}

#endif

void note_python_thread_starting(int delta) { g_threads_starting.fetch_add(delta, std::memory_order_acq_rel); }

void set_python_dump_ready() { g_ready.store(true, std::memory_order_release); }
bool python_dump_ready() { return g_ready.load(std::memory_order_acquire); }

std::vector<PythonThread> parse_python_stacks(std::string_view text) {
  std::vector<PythonThread> threads;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "Current thread 0x") || absl::ConsumePrefix(&rest, "Thread 0x")) {
      const size_t end = rest.find_first_not_of("0123456789abcdefABCDEF");
      uint64_t ident = 0;
      if (!absl::SimpleHexAtoi(rest.substr(0, end), &ident)) continue;
      threads.push_back(PythonThread{ident, {}, false});
      continue;
    }
    if (threads.empty()) continue;
    if (absl::ConsumePrefix(&rest, "  File \"")) {
      // File "path", line N in function
      const size_t quote = rest.rfind("\", line ");
      if (quote == absl::string_view::npos) continue;
      PythonThread::Frame frame;
      frame.file = std::string(rest.substr(0, quote));
      absl::string_view tail = rest.substr(quote + 8);
      const size_t in = tail.find(" in ");
      if (in == absl::string_view::npos) continue;
      if (!absl::SimpleAtoi(tail.substr(0, in), &frame.line)) frame.line = 0;  // "???"
      frame.function = std::string(tail.substr(in + 4));
      threads.back().frames.push_back(std::move(frame));
    } else if (absl::StripAsciiWhitespace(rest) == "...") {
      threads.back().truncated = true;
    }
  }
  return threads;
}

}  // namespace castmesh::debug
