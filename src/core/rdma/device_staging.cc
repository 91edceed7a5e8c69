#include "core/rdma/device_staging.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/tensor_engine.h"
#include "core/rdma/service.h"
#include "core/tensor/device_engine.h"

namespace castmesh::rdma {
namespace {

// Requester staging up to this size is pinned (fast, overlappable copies);
// larger staging is ordinary host memory, which the runtime copies through
// its own pinned bounce buffers.
constexpr size_t kPinnedStagingMax = size_t{64} << 20;
// Idle pinned memory kept for reuse (allocating pinned memory costs
// milliseconds on a real driver), in bytes.
constexpr size_t kIdlePinnedBytes = size_t{64} << 20;

// castmesh's stream for staging copies on each device, made at first use
// and kept: copies on it are synchronised before the caller goes on.
absl::StatusOr<DeviceStream> staging_stream(const Device& device) {
  struct Streams {
    detail::Mutex mu;
    absl::flat_hash_map<std::pair<int32_t, int32_t>, DeviceStream> by_device ABSL_GUARDED_BY(mu);
  };
  static Streams& streams = *new Streams();  // never destroyed: copies may run at exit
  detail::MutexLock lock(streams.mu);
  const auto key = std::make_pair(static_cast<int32_t>(device.kind), device.index);
  if (auto it = streams.by_device.find(key); it != streams.by_device.end()) return it->second;
  absl::StatusOr<DeviceStream> made = DeviceStream::Create(device);
  if (made.ok()) streams.by_device.emplace(key, *made);
  return made;
}

// Copies `n` bytes between `device_bytes` on `device` and host memory, and
// waits for the copy.
absl::Status copy_synchronously(const Device& device, char* device_bytes, char* host_bytes, size_t n,
                                bool to_device) {
  if (n == 0) return absl::OkStatus();
  absl::StatusOr<TensorView> on_device =
      TensorView::Create(device_bytes, DType::kUInt8, {static_cast<int64_t>(n)}, {}, device);
  if (!on_device.ok()) return on_device.status();
  TensorView on_host = TensorView::Contiguous(host_bytes, DType::kUInt8, {static_cast<int64_t>(n)});
  absl::StatusOr<DeviceStream> stream = staging_stream(device);
  if (!stream.ok()) return stream.status();
  absl::Status copied = to_device ? device_copy(*on_device, on_host, *stream) : device_copy(on_host, *on_device, *stream);
  if (!copied.ok()) return copied;
  return stream->synchronize();
}

// Pinned host memory of the backend, with a few idle buffers kept for reuse.
class PinnedPool {
 public:
  static PinnedPool& instance() {
    static auto* pool = new PinnedPool;  // never destroyed: buffers may come back at exit
    return *pool;
  }
  // `n` (> 0) bytes of pinned memory, given back here when the last owner drops it.
  absl::StatusOr<std::shared_ptr<char>> take(const castmesh_tensor_engine_table_v1* table, size_t n) {
    Buffer found{};
    std::vector<Buffer> dropped;
    {
      detail::MutexLock lock(mu_);
      for (size_t i = 0; i < idle_.size(); ++i) {
        if (idle_[i].size >= n) {
          found = idle_[i];
          idle_bytes_ -= found.size;
          idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
      if (found.bytes == nullptr && !idle_.empty()) {  // all too small: sizes changed
        dropped.swap(idle_);
        idle_bytes_ = 0;
      }
    }
    for (const Buffer& b : dropped) free_buffer(b);
    if (found.bytes == nullptr) {
      void* ptr = nullptr;
      castmesh_error_v1 error{};
      const int32_t code = table->pinned_alloc(n, &ptr, &error);
      if (code != CASTMESH_STATUS_OK) return detail::backend_status(code, error, "pinned_alloc");
      found = Buffer{static_cast<char*>(ptr), n, table};
    }
    return std::shared_ptr<char>(found.bytes, [found](char*) { instance().give_back(found); });
  }

 private:
  struct Buffer {
    char* bytes = nullptr;
    size_t size = 0;
    const castmesh_tensor_engine_table_v1* table = nullptr;
  };
  static void free_buffer(const Buffer& b) {
    castmesh_error_v1 ignored{};
    b.table->pinned_free(b.bytes, &ignored);
  }
  void give_back(const Buffer& b) {
    {
      detail::MutexLock lock(mu_);
      if (idle_bytes_ + b.size <= kIdlePinnedBytes) {
        idle_bytes_ += b.size;
        return idle_.push_back(b);
      }
    }
    free_buffer(b);
  }

  detail::Mutex mu_;
  std::vector<Buffer> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Host memory of `n` bytes to stage an operation on `device` through.
absl::StatusOr<TensorView> host_staging(const detail::DeviceEngine& engine, size_t n) {
  if (n == 0 || n > kPinnedStagingMax) return TensorView::TryAllocate(DType::kUInt8, {static_cast<int64_t>(n)});
  absl::StatusOr<std::shared_ptr<char>> pinned = PinnedPool::instance().take(engine.table, n);
  if (!pinned.ok()) return pinned.status();
  char* bytes = pinned->get();
  return TensorView::Contiguous(bytes, DType::kUInt8, {static_cast<int64_t>(n)}, *std::move(pinned));
}

}  // namespace

bool is_device_memory(const TensorView& view) { return detail::is_engine_device(view.device()); }

absl::Status check_device_backend(const TensorView& view, std::string_view what) {
  return detail::device_engine_for(view.device(), absl::string_view(what.data(), what.size())).status();
}

absl::Status copy_out(const Registration& registration, uint64_t offset, char* dst, size_t n) {
  if (!is_device_memory(registration.view)) {
    if (n > 0) std::memcpy(dst, registration.base + offset, n);
    return absl::OkStatus();
  }
  return copy_synchronously(registration.view.device(), registration.base + offset, dst, n, /*to_device=*/false);
}

absl::Status copy_in(const Registration& registration, uint64_t offset, const char* src, size_t n) {
  if (!is_device_memory(registration.view)) {
    if (n > 0) std::memcpy(registration.base + offset, src, n);
    return absl::OkStatus();
  }
  // The copy only reads `src`; the view type has no const flavour.
  return copy_synchronously(registration.view.device(), registration.base + offset, const_cast<char*>(src), n,
                            /*to_device=*/true);
}

// The pinned chunks of one read alive at once (sent ones drop theirs).
struct ReadStager::Budget {
  detail::Mutex mu;
  detail::CondVar freed;
  int alive ABSL_GUARDED_BY(mu) = 0;
};

ReadStager::ReadStager(std::shared_ptr<const Registration> registration)
    : registration_(std::move(registration)), budget_(std::make_shared<Budget>()) {}

absl::StatusOr<wire::Payload> ReadStager::chunk(uint64_t offset, size_t n) {
  if (!is_device_memory(registration_->view) || n == 0) {
    return wire::Payload::share(registration_, registration_->base + offset, n);
  }
  absl::StatusOr<const detail::DeviceEngine*> engine =
      detail::device_engine_for(registration_->view.device(), "an RDMA buffer over device memory");
  if (!engine.ok()) return engine.status();
  {
    detail::MutexLock lock(budget_->mu);
    budget_->freed.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(budget_->mu) {
      return budget_->alive < kStagedChunksPerRead;
    });
    ++budget_->alive;
  }
  // Counted until the transport has sent the chunk and dropped it.
  std::shared_ptr<Budget> budget = budget_;
  auto give_back = [budget] {
    detail::MutexLock lock(budget->mu);
    --budget->alive;
    budget->freed.notify_all();
  };
  absl::StatusOr<std::shared_ptr<char>> pinned = PinnedPool::instance().take((*engine)->table, n);
  if (!pinned.ok()) {
    give_back();
    return pinned.status();
  }
  if (absl::Status copied = copy_out(*registration_, offset, pinned->get(), n); !copied.ok()) {
    give_back();
    return copied;
  }
  char* bytes = pinned->get();
  auto counted = std::shared_ptr<const void>(bytes, [pinned = *std::move(pinned), give_back](const void*) mutable {
    pinned.reset();
    give_back();
  });
  return wire::Payload::share(std::move(counted), bytes, n);
}

Future<RdmaResult> staged(const TensorView& local, bool write, size_t length, const HostOperation& host_op) {
  const char* role = write ? "an RDMA write from " : "an RDMA read into ";
  absl::StatusOr<const detail::DeviceEngine*> engine =
      detail::device_engine_for(local.device(), absl::StrCat(role, local.device().to_string(), " memory"));
  if (!engine.ok()) return make_failed_future<RdmaResult>(engine.status());
  absl::StatusOr<TensorView> host = host_staging(**engine, length);
  if (!host.ok()) return make_failed_future<RdmaResult>(host.status());
  auto* device_bytes = static_cast<char*>(local.data());
  auto* host_bytes = static_cast<char*>(host->data());
  auto mark = [](RdmaResult r) {
    r.staged = true;
    return r;
  };
  if (write) {  // the bytes are on the host before anything is sent
    if (absl::Status st = copy_synchronously(local.device(), device_bytes, host_bytes, length, false); !st.ok()) {
      return make_failed_future<RdmaResult>(st);
    }
    return host_op(*host).then(mark);
  }
  auto* state = new detail::FutureState<RdmaResult>();
  state->ref();  // the continuation's reference
  Future<RdmaResult> result(state);
  host_op(*host).on_ready([state, local, staging = *host, mark](absl::StatusOr<RdmaResult> done) {
    if (!done.ok()) {  // the destination is never touched
      state->set(absl::StatusOr<RdmaResult>(done.status()));
      return state->unref();
    }
    // A large copy must not hold the thread that completed the transfer (an I/O thread).
    run_job(done->bytes, [state, local, staging, mark, r = *done] {
      absl::Status st = copy_synchronously(local.device(), static_cast<char*>(local.data()),
                                           static_cast<char*>(staging.data()), r.bytes, /*to_device=*/true);
      if (st.ok()) {
        state->set(absl::StatusOr<RdmaResult>(mark(r)));
      } else {
        state->set(absl::StatusOr<RdmaResult>(st));
      }
      state->unref();
    });
  });
  return result;
}

}  // namespace castmesh::rdma
