#include "core/wire/payload.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::wire {
namespace {

// Large receive buffers are recycled: a fresh 64 MiB allocation costs a page
// fault per 4 KiB on first touch (about as long as moving the bytes over a
// Unix socket), and received payloads are usually dropped soon after their
// handler ran. Buffers of at least kPooledMin bytes return here when their
// last Payload goes away; up to kPoolBytes stay cached. Thread-safe.
class LargeBufferPool {
 public:
  static constexpr std::size_t kPooledMin = std::size_t{1} << 20;
  static constexpr std::size_t kPoolBytes = std::size_t{512} << 20;

  // A buffer of at least `size` bytes (at most 25% larger); its capacity in
  // `capacity`. nullptr (errno set) when no memory can be mapped: mmap, not
  // malloc, so that a size no allocator can serve fails the same way under
  // the sanitizers' allocators as under glibc's.
  char* take(std::size_t size, std::size_t* capacity) {
    {
      detail::MutexLock lock(mu_);
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= size + size / 4) {
        char* buffer = it->second;
        *capacity = it->first;
        cached_bytes_ -= it->first;
        free_.erase(it);
        return buffer;
      }
    }
    *capacity = size;
    void* buffer = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return buffer == MAP_FAILED ? nullptr : static_cast<char*>(buffer);
  }

  void give(char* buffer, std::size_t capacity) {
    {
      detail::MutexLock lock(mu_);
      if (cached_bytes_ + capacity <= kPoolBytes) {
        cached_bytes_ += capacity;
        free_.emplace(capacity, buffer);
        return;
      }
    }
    ::munmap(buffer, capacity);
  }

 private:
  detail::Mutex mu_;
  std::multimap<std::size_t, char*> free_ ABSL_GUARDED_BY(mu_);
  std::size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

LargeBufferPool& large_buffer_pool() {
  static auto* pool = new LargeBufferPool;  // never destroyed: payloads may outlive statics
  return *pool;
}

}  // namespace

Payload Payload::adopt(std::string&& bytes) {
  auto owner = std::make_shared<std::string>(std::move(bytes));
  Payload p;
  p.size_ = owner->size();
  p.data_ = std::shared_ptr<const char>(owner, owner->data());
  return p;
}

Payload Payload::copy_of(std::string_view bytes) {
  char* out = nullptr;
  Payload p = allocate(bytes.size(), &out);
  if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  return p;
}

Payload Payload::share(std::shared_ptr<const void> owner, const char* data, std::size_t size) {
  Payload p;
  p.size_ = size;
  p.data_ = std::shared_ptr<const char>(std::move(owner), data);
  return p;
}

Payload Payload::borrow(std::string_view bytes) {
  Payload p;
  p.size_ = bytes.size();
  p.data_ = std::shared_ptr<const char>(std::shared_ptr<const char>(), bytes.data());  // aliases nothing
  p.borrowed_ = true;
  return p;
}

Payload Payload::owned() const { return borrowed_ ? copy_of(view()) : *this; }

Payload Payload::allocate(std::size_t size, char** writable) {
  if (size >= LargeBufferPool::kPooledMin) {
    std::size_t capacity = 0;
    char* buffer = large_buffer_pool().take(size, &capacity);
    if (buffer == nullptr) throw std::bad_alloc();
    *writable = buffer;
    Payload p;
    p.size_ = size;
    p.data_ = std::shared_ptr<const char>(
        buffer, [capacity](const char* b) { large_buffer_pool().give(const_cast<char*>(b), capacity); });
    return p;
  }
  // make_shared_for_overwrite: no zero-fill of a buffer the reader is about
  // to overwrite (64 MiB of memset is measurable).
  std::shared_ptr<char[]> buffer = std::make_shared_for_overwrite<char[]>(size == 0 ? 1 : size);
  *writable = buffer.get();
  Payload p;
  p.size_ = size;
  p.data_ = std::shared_ptr<const char>(buffer, buffer.get());
  return p;
}

absl::StatusOr<Payload> Payload::try_allocate(std::size_t size, char** writable) {
  errno = 0;
  try {
    return allocate(size, writable);
  } catch (const std::bad_alloc&) {
    const int error = errno;
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes for a payload",
                                                     error != 0 ? absl::StrCat(": ", std::strerror(error)) : ""));
  }
}

}  // namespace castmesh::wire
