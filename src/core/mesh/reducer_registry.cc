// Registry of reducers that the cast relays of other procs can fold with
// (castmesh/value_mesh.h: Reducer::registered, CASTMESH_REGISTER_REDUCER).
#include <map>
#include <string>
#include <utility>

#include "castmesh/detail/mutex.h"
#include "castmesh/value_mesh.h"
#include "core/log/log.h"

namespace castmesh::detail {
namespace {

struct ReducerEntry {
  std::shared_ptr<const void> typed;
  EncodedFold fold;
};

struct ReducerRegistry {
  detail::Mutex mu;
  // std::map: entries never move, so find_encoded_fold may hand out pointers.
  std::map<std::pair<std::string, std::string>, ReducerEntry, std::less<>> entries ABSL_GUARDED_BY(mu);
};

ReducerRegistry& registry() {
  static auto* r = new ReducerRegistry;  // used during static initialisation and exit
  return *r;
}

}  // namespace

void register_reducer_entry(std::string name, std::string value_type, std::shared_ptr<const void> typed,
                            EncodedFold fold) {
  detail::MutexLock lock(registry().mu);
  auto key = std::make_pair(std::move(name), std::move(value_type));
  if (registry().entries.count(key) != 0) {
    // Built-ins are registered once per instantiating binary; a user
    // registration under a taken key is the case worth a word.
    CASTMESH_LOG_DEBUG("reducer '{}' over {} registered twice; keeping the first", key.first, key.second);
    return;
  }
  registry().entries.emplace(std::move(key), ReducerEntry{std::move(typed), std::move(fold)});
}

std::shared_ptr<const void> find_reducer_combine(std::string_view name, std::string_view value_type) {
  detail::MutexLock lock(registry().mu);
  auto it = registry().entries.find(std::make_pair(std::string(name), std::string(value_type)));
  return it == registry().entries.end() ? nullptr : it->second.typed;
}

const EncodedFold* find_encoded_fold(std::string_view name, std::string_view value_type) {
  detail::MutexLock lock(registry().mu);
  auto it = registry().entries.find(std::make_pair(std::string(name), std::string(value_type)));
  return it == registry().entries.end() ? nullptr : &it->second.fold;
}

}  // namespace castmesh::detail
