#include "core/platform/cpu_binding.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace castmesh::platform {
namespace {

// The CPUs of a list such as "0-3,8"; empty on a syntax error.
std::vector<int> parse_cpu_list(absl::string_view list) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const size_t dash = part.find('-');
    absl::string_view first = part.substr(0, dash);
    absl::string_view last = dash == absl::string_view::npos ? first : part.substr(dash + 1);
    int a = -1, b = -1;
    auto [pa, ea] = std::from_chars(first.data(), first.data() + first.size(), a);
    auto [pb, eb] = std::from_chars(last.data(), last.data() + last.size(), b);
    if (ea != std::errc() || eb != std::errc() || pa != first.data() + first.size() ||
        pb != last.data() + last.size() || a < 0 || b < a || b >= 4096) {
      return {};
    }
    for (int cpu = a; cpu <= b; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
#endif
  return cpus;
}

}  // namespace

absl::Status check_proc_bind(absl::string_view spec) {
  if (spec.empty() || spec == "cores") return absl::OkStatus();
  for (absl::string_view list : absl::StrSplit(spec, ';')) {
    if (parse_cpu_list(list).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "proc_bind '", spec, "': '", list, "' is not a CPU list; use \"cores\" or lists such as \"0-3;4-7\""));
    }
  }
  return absl::OkStatus();
}

std::string cpu_binding_for(absl::string_view spec, size_t local_index) {
  if (spec.empty()) return "";
  if (spec == "cores") {
    const std::vector<int> cpus = allowed_cpus();
    return cpus.empty() ? "" : absl::StrCat(cpus[local_index % cpus.size()]);
  }
  std::vector<absl::string_view> lists = absl::StrSplit(spec, ';');
  return std::string(lists[local_index % lists.size()]);
}

absl::Status bind_this_process(absl::string_view cpus) {
  const std::vector<int> list = parse_cpu_list(cpus);
  if (list.empty()) return absl::InvalidArgumentError(absl::StrCat(kEnvCpuBind, "='", cpus, "' is not a CPU list"));
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : list) CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvCpuBind, "='", cpus, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError("CPU binding needs Linux");
#endif
}

}  // namespace castmesh::platform
