// A POSIX shared-memory staging window between two processes of one host
// (shm_open + mmap): the shared-segment transport of RDMA buffers, used
// where the kernel refuses cross-memory attach (docs/rdma.md).
//
// The requester creates a window under a random name (128 bits) with mode
// 0600, so only processes of the same user can open it (the same trust as
// cross-memory attach; /dev/shm may be listed by anyone, which is why the
// name lives only until the owner mapped it). It sends the name over the
// procs' authenticated connection; the
// owner maps it and unlinks the name at once, and the requester unlinks it
// too on the owner's first answer or when the operation ends, so no name
// outlives an operation in /dev/shm. The window is `slots` slots of
// `slot_bytes` each: the copier on one side fills a slot while the other
// side empties another.
//
// Thread-safe (immutable after creation but for unlink()).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace castmesh::rdma {

// Bounds on a window a peer asks this process to map (a peer's numbers are not trusted).
inline constexpr uint64_t kMinSlotBytes = 1024;
inline constexpr uint64_t kMaxSlotBytes = uint64_t{16} << 20;
inline constexpr uint32_t kMaxSlots = 16;

class SegmentMapping {
 public:
  // Requester side: a new window under a fresh name. kResourceExhausted
  // when the system has no room for it (e.g. a small /dev/shm).
  static absl::StatusOr<std::shared_ptr<SegmentMapping>> create(uint64_t slot_bytes, uint32_t slots);
  // Owner side: maps the window `name` made by a peer and unlinks the
  // name. kInvalidArgument for a bad name or geometry, kUnavailable when
  // it cannot be opened (another mount namespace, already gone).
  static absl::StatusOr<std::shared_ptr<SegmentMapping>> attach(const std::string& name, uint64_t slot_bytes,
                                                                uint32_t slots);
  ~SegmentMapping();
  SegmentMapping(const SegmentMapping&) = delete;
  SegmentMapping& operator=(const SegmentMapping&) = delete;

  // Removes the name (idempotent; the mappings stay valid).
  void unlink();

  const std::string& name() const { return name_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  // The first byte of slot `i` (< slots()).
  char* slot(uint32_t i) const { return base_ + i * slot_bytes_; }

  // The prefix of every window name this process creates: "/castmesh-rdma-<pid>-".
  static std::string name_prefix_of_this_process();

 private:
  SegmentMapping(std::string name, char* base, uint64_t slot_bytes, uint32_t slots)
      : name_(std::move(name)), base_(base), slot_bytes_(slot_bytes), slots_(slots) {}

  const std::string name_;
  char* const base_;
  const uint64_t slot_bytes_;
  const uint32_t slots_;
  std::atomic<bool> unlinked_{false};
};

}  // namespace castmesh::rdma
