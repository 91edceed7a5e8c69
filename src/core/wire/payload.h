// Payload: the immutable bytes of one message, shared without copying.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace castmesh::wire {

// The bytes of one message on their way through the transport. Copying a
// Payload shares the bytes (reference counted); the transport copies only a
// small payload into its outbound queue (or a borrowed one it must keep),
// and on the way in a large payload is read straight into the buffer the
// receiver gets. Immutable once built, so any
// thread may read a Payload; one Payload object must not be assigned
// concurrently.
class Payload {
 public:
  Payload() = default;

  // Takes ownership of `bytes` (moved, not copied).
  static Payload adopt(std::string&& bytes);
  // Copies `bytes` (for small payloads and tests).
  static Payload copy_of(std::string_view bytes);
  // Shares `data[0, size)` kept alive by `owner`.
  static Payload share(std::shared_ptr<const void> owner, const char* data, std::size_t size);
  // The caller's `bytes`, not owned: valid only until the call it is passed
  // to returns. For sends (transport::Endpoint::send copies a small payload
  // into its queue before it returns, and takes owned() of any other); a
  // layer that keeps a payload past the call takes owned() first.
  static Payload borrow(std::string_view bytes);
  // This payload if it owns (shares) its bytes, else an owning copy.
  Payload owned() const;
  // Whether the bytes are borrowed (see borrow()).
  bool borrowed() const { return borrowed_; }
  // A buffer of `size` uninitialised bytes for a reader to fill; `writable`
  // is valid until the Payload is handed on. Only the reader that made it
  // writes into it. Buffers of 1 MiB and more are recycled through a
  // process-wide pool (up to 512 MiB cached) to avoid first-touch page
  // faults on every large message.
  // Throws std::bad_alloc when the memory cannot be had.
  static Payload allocate(std::size_t size, char** writable);
  // Like allocate(), for sizes a peer announced: memory that cannot be had
  // is ResourceExhausted (with the size and the reason), never an exception.
  static absl::StatusOr<Payload> try_allocate(std::size_t size, char** writable);

  const char* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {data_.get(), size_}; }

 private:
  std::shared_ptr<const char> data_;
  std::size_t size_ = 0;
  bool borrowed_ = false;
};

}  // namespace castmesh::wire
