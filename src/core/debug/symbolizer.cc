#include "core/debug/symbolizer.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <elf.h>
#include <link.h>
#endif

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/platform/process.h"

namespace castmesh::debug {
namespace {

// Whether the object mapped at `base` is a fixed-address executable
// (addresses in it are absolute) rather than position-independent.
bool is_fixed_address(const void* base) {
#if !defined(__linux__)
  (void)base;
  return false;  // Mach-O and others: dladdr's names only (addr2line is not run)
#else
  const auto* header = static_cast<const unsigned char*>(base);
  if (header == nullptr || std::memcmp(header, ELFMAG, SELFMAG) != 0) return false;
  const auto* ehdr = reinterpret_cast<const ElfW(Ehdr)*>(base);
  return ehdr->e_type == ET_EXEC;
#endif
}

// The file an object name of the dynamic linker stands for, as another
// process (addr2line) can open it: the main program may be named
// "/proc/self/exe" (how workers re-execute themselves) or by a bare or
// relative argv[0]; links are resolved.
std::string object_path(const char* name) {
  const std::string given = name != nullptr ? name : "";
  const char* lookup = given.empty() || given.find('/') == std::string::npos ? "/proc/self/exe" : given.c_str();
  char* real = realpath(lookup, nullptr);
  if (real == nullptr) return given;
  std::string path(real);
  std::free(real);
  return path;
}

// Runs `addr2line -f -C -e object offsets...` and returns its output (two
// lines per offset), or "" when it is not on PATH, fails or runs past
// `deadline` (then it is killed).
std::string run_addr2line(const std::string& object, const std::vector<uint64_t>& offsets, absl::Time deadline) {
#if !defined(__linux__)
  (void)object;
  (void)offsets;
  (void)deadline;
  return "";
#else
  std::vector<std::string> args = {"addr2line", "-f", "-C", "-e", object};
  for (uint64_t off : offsets) args.push_back(absl::StrCat("0x", absl::Hex(off)));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  pid_t child = -1;
  const int rc = posix_spawnp(&child, "addr2line", &actions, nullptr, argv.data(), platform::environment());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return "";
  }
  std::string text;
  bool complete = false;
  for (;;) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) break;
    pollfd pfd{out[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      complete = n == 0;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  if (!complete) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!complete || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return "";
  return text;
#endif
}

}  // namespace

std::string demangle(std::string_view name) {
  std::string input(name);
  int status = 0;
  char* out = abi::__cxa_demangle(input.c_str(), nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return input;
  std::string result(out);
  std::free(out);
  return result;
}

std::vector<Symbol> symbolize(const std::vector<uintptr_t>& pcs, const std::vector<bool>& return_address,
                              bool file_lines, absl::Duration budget) {
  const absl::Time deadline = absl::Now() + budget;
  std::vector<Symbol> symbols(pcs.size());
  // Object -> (offset, index in pcs) of what addr2line should look up.
  std::map<std::string, std::vector<std::pair<uint64_t, size_t>>> by_object;
  std::map<std::string, std::string> paths;  // dladdr's object name -> object_path()
  for (size_t i = 0; i < pcs.size(); ++i) {
    const bool is_return = i < return_address.size() && return_address[i];
    const uintptr_t lookup = is_return && pcs[i] > 0 ? pcs[i] - 1 : pcs[i];
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(lookup), &info) == 0) continue;
    Symbol& s = symbols[i];
    auto [known, added] = paths.try_emplace(info.dli_fname != nullptr ? info.dli_fname : "", std::string());
    if (added) known->second = object_path(info.dli_fname);
    s.object = known->second;
    if (info.dli_sname != nullptr) s.function = demangle(info.dli_sname);
    const bool fixed = is_fixed_address(info.dli_fbase);
    s.offset = fixed ? lookup : lookup - reinterpret_cast<uintptr_t>(info.dli_fbase);
    if (file_lines && !s.object.empty()) by_object[s.object].emplace_back(s.offset, i);
  }
  for (const auto& [object, wanted] : by_object) {
    if (absl::Now() >= deadline) break;
    std::vector<uint64_t> offsets;
    for (const auto& w : wanted) offsets.push_back(w.first);
    const std::string text = run_addr2line(object, offsets, deadline);
    if (text.empty()) continue;
    std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
    for (size_t k = 0; k < wanted.size() && 2 * k + 1 < lines.size(); ++k) {
      Symbol& s = symbols[wanted[k].second];
      const absl::string_view function = lines[2 * k];
      absl::string_view where = lines[2 * k + 1];
      if (function != "??" && !function.empty()) s.function = std::string(function);
      if (const size_t paren = where.find(" ("); paren != absl::string_view::npos) where = where.substr(0, paren);
      const size_t colon = where.rfind(':');
      if (colon == absl::string_view::npos || where.substr(0, colon) == "??") continue;
      int line = 0;
      if (absl::SimpleAtoi(where.substr(colon + 1), &line) && line > 0) {
        s.file = std::string(where.substr(0, colon));
        s.line = line;
      }
    }
  }
  return symbols;
}

}  // namespace castmesh::debug
