#include "core/proc/proc_service.h"

#include <algorithm>
#include <utility>

#include "castmesh/detail/mutex.h"

namespace castmesh::proc {
namespace {

struct ServiceTable {
  detail::Mutex mu;
  std::vector<std::pair<std::string, ProcServiceInstaller>> installers ABSL_GUARDED_BY(mu);
};

// Leaked on purpose: static initializers of other translation units may
// register before this one's statics would be constructed.
ServiceTable& service_table() {
  static auto* table = new ServiceTable;
  return *table;
}

}  // namespace

void register_proc_service(std::string name, ProcServiceInstaller installer) {
  ServiceTable& table = service_table();
  detail::MutexLock lock(table.mu);
  auto it = std::find_if(table.installers.begin(), table.installers.end(),
                         [&](const auto& entry) { return entry.first == name; });
  if (it != table.installers.end()) {
    it->second = std::move(installer);
  } else {
    table.installers.emplace_back(std::move(name), std::move(installer));
  }
}

std::vector<std::pair<std::string, ProcServiceInstaller>> registered_proc_services() {
  ServiceTable& table = service_table();
  detail::MutexLock lock(table.mu);
  return table.installers;
}

}  // namespace castmesh::proc
