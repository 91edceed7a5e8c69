// Registry of actor classes that other procs may spawn by name.

#include "absl/container/flat_hash_map.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/proc_mesh.h"
#include "core/log/log.h"
#include "core/proc/actor_registry.h"

namespace castmesh {
namespace {

struct ActorRegistry {
  detail::Mutex mu;
  absl::flat_hash_map<std::string, detail::ActorFactory> by_name ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint32_t, std::string> name_of_class ABSL_GUARDED_BY(mu);
};

ActorRegistry& registry() {
  static auto* r = new ActorRegistry;  // used during static initialisation and exit
  return *r;
}

}  // namespace

namespace detail {

void register_actor_factory(uint32_t class_id, ActorFactory factory) {
  detail::MutexLock lock(registry().mu);
  const std::string name = factory.name;
  if (!registry().by_name.emplace(name, std::move(factory)).second) {
    CASTMESH_LOG_WARN("actor type name '{}' registered twice; keeping the first", name);
    return;
  }
  registry().name_of_class.emplace(class_id, name);
}

std::string registered_actor_name(uint32_t class_id) {
  detail::MutexLock lock(registry().mu);
  auto it = registry().name_of_class.find(class_id);
  return it == registry().name_of_class.end() ? std::string() : it->second;
}

}  // namespace detail

namespace proc {

std::optional<detail::ActorFactory> find_actor_factory(const std::string& name) {
  detail::MutexLock lock(registry().mu);
  auto it = registry().by_name.find(name);
  if (it == registry().by_name.end()) return std::nullopt;
  return it->second;
}

}  // namespace proc
}  // namespace castmesh
