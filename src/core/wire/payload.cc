#include "core/wire/payload.h"

#include <cstring>
#include <utility>

namespace castmesh::wire {

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

Payload Payload::allocate(std::size_t size, char** writable) {
  // make_shared_for_overwrite: no zero-fill of a buffer the reader is about
  // to overwrite (64 MiB of memset is measurable).
  std::shared_ptr<char[]> buffer = std::make_shared_for_overwrite<char[]>(size == 0 ? 1 : size);
  *writable = buffer.get();
  Payload p;
  p.size_ = size;
  p.data_ = std::shared_ptr<const char>(buffer, buffer.get());
  return p;
}

}  // namespace castmesh::wire
