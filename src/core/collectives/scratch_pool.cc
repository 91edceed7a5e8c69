#include "core/collectives/scratch_pool.h"

#include <algorithm>
#include <utility>

namespace castmesh::collectives {

ScratchPool::Lease::~Lease() {
  if (pool_ != nullptr && buffer_.bytes != nullptr) pool_->give_back(std::move(buffer_));
}

ScratchPool::Lease ScratchPool::take(size_t bytes) {
  {
    detail::MutexLock lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->size >= bytes && (best == idle_.end() || it->size < best->size)) best = it;
    }
    if (best != idle_.end()) {
      Buffer found = std::move(*best);
      idle_.erase(best);
      return Lease(this, std::move(found));
    }
  }
  // Not zero-filled: every byte a call reads was received into it first.
  const size_t size = std::max<size_t>(bytes, 1);
  return Lease(this, Buffer{std::unique_ptr<char[]>(new char[size]), size});
}

void ScratchPool::give_back(Buffer buffer) {
  Buffer dropped;  // freed outside the lock
  detail::MutexLock lock(mu_);
  idle_.push_back(std::move(buffer));
  if (idle_.size() > kMaxIdle) {
    auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                     [](const Buffer& a, const Buffer& b) { return a.size < b.size; });
    dropped = std::move(*smallest);
    idle_.erase(smallest);
  }
}

}  // namespace castmesh::collectives
