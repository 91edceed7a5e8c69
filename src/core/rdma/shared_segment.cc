#include "core/rdma/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace castmesh::rdma {
namespace {

// 128 random bits: another local process cannot guess a live name.
std::string random_suffix() {
  std::random_device random;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&out, "%08x", static_cast<uint32_t>(random()));
  return out;
}

bool valid_geometry(uint64_t slot_bytes, uint32_t slots) {
  return slot_bytes >= kMinSlotBytes && slot_bytes <= kMaxSlotBytes && slots >= 1 && slots <= kMaxSlots;
}

absl::StatusOr<char*> map_fd(int fd, uint64_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  return static_cast<char*>(base);
}

}  // namespace

std::string SegmentMapping::name_prefix_of_this_process() { return absl::StrCat("/castmesh-rdma-", ::getpid(), "-"); }

absl::StatusOr<std::shared_ptr<SegmentMapping>> SegmentMapping::create(uint64_t slot_bytes, uint32_t slots) {
  if (!valid_geometry(slot_bytes, slots)) {
    return absl::InvalidArgumentError(absl::StrCat("a shared segment of ", slots, " slots of ", slot_bytes, " bytes"));
  }
  const uint64_t bytes = slot_bytes * slots;
  std::string name = name_prefix_of_this_process() + random_suffix();
#if defined(__APPLE__)
  name.resize(std::min<size_t>(name.size(), 31));  // PSHMNAMLEN
#endif
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  absl::Status sized;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    sized = absl::ResourceExhaustedError(absl::StrCat("ftruncate: ", std::strerror(errno)));
  }
#if defined(__linux__)
  // Reserve the pages now: a full tmpfs would otherwise kill the first
  // writer with SIGBUS instead of failing here.
  if (sized.ok()) {
    if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
      sized = absl::ResourceExhaustedError(absl::StrCat("no room for a ", bytes, "-byte shared segment in /dev/shm (",
                                                        std::strerror(error), ")"));
    }
  }
#endif
  absl::StatusOr<char*> base = sized.ok() ? map_fd(fd, bytes) : absl::StatusOr<char*>(sized);
  ::close(fd);
  if (!base.ok()) {
    ::shm_unlink(name.c_str());
    return base.status();
  }
  return std::shared_ptr<SegmentMapping>(new SegmentMapping(name, *base, slot_bytes, slots));
}

absl::StatusOr<std::shared_ptr<SegmentMapping>> SegmentMapping::attach(const std::string& name, uint64_t slot_bytes,
                                                                       uint32_t slots) {
  if (!valid_geometry(slot_bytes, slots)) {
    return absl::InvalidArgumentError(absl::StrCat("a shared segment of ", slots, " slots of ", slot_bytes, " bytes"));
  }
  if (name.size() < 2 || name.size() > 200 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.rfind("/castmesh-rdma-", 0) != 0) {
    return absl::InvalidArgumentError("not a castmesh shared-segment name");
  }
  const uint64_t bytes = slot_bytes * slots;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  ::shm_unlink(name.c_str());  // both sides map it now (or the requester gave up): no name left behind
  struct stat info {};
  absl::StatusOr<char*> base = absl::InvalidArgumentError("the shared segment is smaller than announced");
  if (::fstat(fd, &info) == 0 && static_cast<uint64_t>(info.st_size) >= bytes) base = map_fd(fd, bytes);
  ::close(fd);
  if (!base.ok()) return base.status();
  auto mapping = std::shared_ptr<SegmentMapping>(new SegmentMapping(name, *base, slot_bytes, slots));
  mapping->unlinked_ = true;
  return mapping;
}

SegmentMapping::~SegmentMapping() { ::munmap(base_, slot_bytes_ * slots_); }

void SegmentMapping::unlink() {
  if (!unlinked_.exchange(true)) ::shm_unlink(name_.c_str());
}

}  // namespace castmesh::rdma
