#include "core/mesh/mesh_directory.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::mesh {
namespace {

struct Directory {
  detail::Mutex mu;
  // Member -> its meshes, oldest first.
  absl::flat_hash_map<Address, std::vector<std::shared_ptr<const MeshMembership>>> by_member ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<const MeshMembership>> by_key ABSL_GUARDED_BY(mu);
  std::vector<std::function<void(const std::string&)>> removal_observers ABSL_GUARDED_BY(mu);
};

// Leaked: members may look themselves up during static destruction.
Directory& directory() {
  static auto* d = new Directory;
  return *d;
}

void unlist(Directory& d, const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  auto it = d.by_key.find(key);
  if (it == d.by_key.end()) return;
  for (const Address& member : it->second->members) {
    auto entry = d.by_member.find(member);
    if (entry == d.by_member.end()) continue;
    std::erase_if(entry->second, [&](const auto& m) { return m->key == key; });
    if (entry->second.empty()) d.by_member.erase(entry);
  }
  d.by_key.erase(it);
}

}  // namespace

void MeshDirectory::add(std::shared_ptr<const MeshMembership> mesh) {
  Directory& d = directory();
  detail::MutexLock lock(d.mu);
  unlist(d, mesh->key);
  for (const Address& member : mesh->members) d.by_member[member].push_back(mesh);
  d.by_key[mesh->key] = std::move(mesh);
}

void MeshDirectory::remove(const std::string& key) {
  Directory& d = directory();
  std::vector<std::function<void(const std::string&)>> observers;
  {
    detail::MutexLock lock(d.mu);
    unlist(d, key);
    observers = d.removal_observers;
  }
  for (const auto& observer : observers) observer(key);
}

void MeshDirectory::on_remove(std::function<void(const std::string& key)> observer) {
  Directory& d = directory();
  detail::MutexLock lock(d.mu);
  d.removal_observers.push_back(std::move(observer));
}

std::shared_ptr<const MeshMembership> MeshDirectory::find(const Address& member) {
  Directory& d = directory();
  detail::MutexLock lock(d.mu);
  auto it = d.by_member.find(member);
  if (it == d.by_member.end() || it->second.empty()) return nullptr;
  return it->second.back();
}

}  // namespace castmesh::mesh
