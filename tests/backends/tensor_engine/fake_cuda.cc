#include "fake_cuda.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace castmesh::fakes {
namespace {

// The cudaError_t values the fake returns.
constexpr int kCudaSuccess = 0;
constexpr int kCudaInvalidValue = 1;
constexpr int kCudaMemoryAllocation = 2;
constexpr int kCudaInvalidDevice = 101;
constexpr int kCudaNotReady = 600;
constexpr int kDevices = 4;
constexpr size_t kMaxAllocation = size_t{1} << 30;

// A FIFO executor: one thread runs the stream's work in enqueue order.
class Stream {
 public:
  Stream() : worker_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    cv_.notify_all();
  }
  bool drained() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ == enqueued_;
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return completed_ >= target; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++completed_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts after the fields above exist
};

// The runtime's special stream values a caller may wrap (DLPack passes them:
// CUDA's 0x1 legacy and 0x2 per-thread default streams, HIP's null stream):
// one process-wide fake stream stands for all three.
Stream* as_stream(void* stream) {
  if (reinterpret_cast<uintptr_t>(stream) > 2) return static_cast<Stream*>(stream);
  static Stream& default_stream = *new Stream();  // never destroyed: used until exit
  return &default_stream;
}

// Record n makes generation n; the event is complete once generation
// `recorded` has run on its stream.
struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;
};

// Never destroyed: the core's watchdog thread may still free fake device
// memory while a worker proc runs its static destructors at exit.
std::mutex g_memory_mu;
std::set<void*>& g_device_memory ABSL_GUARDED_BY(g_memory_mu) = *new std::set<void*>;
std::set<void*>& g_pinned_memory ABSL_GUARDED_BY(g_memory_mu) = *new std::set<void*>;
CASTMESH_FAKE_THREAD_LOCAL void* t_last_stream = nullptr;

int set_device(int device) { return device >= 0 && device < kDevices ? kCudaSuccess : kCudaInvalidDevice; }

int alloc_into(std::set<void*>& pool, void** ptr, size_t bytes) {
  if (bytes > kMaxAllocation) return kCudaMemoryAllocation;
  *ptr = std::malloc(bytes);
  if (*ptr == nullptr) return kCudaMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_memory_mu);
  pool.insert(*ptr);
  return kCudaSuccess;
}

int free_from(std::set<void*>& pool, void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_memory_mu);
    if (pool.erase(ptr) == 0) return kCudaInvalidValue;
  }
  std::free(ptr);
  return kCudaSuccess;
}

int malloc_device(void** ptr, size_t bytes) { return alloc_into(g_device_memory, ptr, bytes); }
int free_device(void* ptr) { return free_from(g_device_memory, ptr); }
int malloc_host(void** ptr, size_t bytes) { return alloc_into(g_pinned_memory, ptr, bytes); }
int free_host(void* ptr) { return free_from(g_pinned_memory, ptr); }

int stream_create(void** stream) {
  *stream = new Stream();
  t_last_stream = *stream;
  return kCudaSuccess;
}
// Real CUDA returns at once and frees the stream when its work is done; the
// fake drains first, which the caller cannot tell apart.
int stream_destroy(void* stream) {
  delete static_cast<Stream*>(stream);
  return kCudaSuccess;
}
int stream_query(void* stream) { return as_stream(stream)->drained() ? kCudaSuccess : kCudaNotReady; }
int stream_synchronize(void* stream) {
  as_stream(stream)->synchronize();
  return kCudaSuccess;
}

int event_create(void** event) {
  *event = new Event();
  return kCudaSuccess;
}
int event_destroy(void* event) {
  delete static_cast<Event*>(event);
  return kCudaSuccess;
}
int event_record(void* event, void* stream) {
  Event* e = static_cast<Event*>(event);
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    generation = ++e->recorded;
  }
  as_stream(stream)->enqueue([e, generation] {
    // Notified under the lock: a waiter that returns may destroy the event.
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->completed < generation) e->completed = generation;
    e->cv.notify_all();
  });
  return kCudaSuccess;
}
int event_query(void* event) {
  Event* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(e->mu);
  return e->completed >= e->recorded ? kCudaSuccess : kCudaNotReady;
}
int event_synchronize(void* event) {
  Event* e = static_cast<Event*>(event);
  std::unique_lock<std::mutex> lock(e->mu);
  const uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  return kCudaSuccess;
}
int stream_wait_event(void* stream, void* event) {
  Event* e = static_cast<Event*>(event);
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;  // the work captured by the latest record, as in CUDA
  }
  as_stream(stream)->enqueue([e, target] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
  return kCudaSuccess;
}
std::atomic<int64_t> g_copies[4];  // by castmesh_te_copy_kind_v1

int memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  if (kind < 1 || kind > 3) return kCudaInvalidValue;
  g_copies[kind].fetch_add(1);
  if (kind == CASTMESH_TE_COPY_HOST_TO_DEVICE) {
    // CUDA stages a pageable host source before returning, so the caller may
    // reuse it at once; the fake takes the same snapshot.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    as_stream(stream)->enqueue([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return kCudaSuccess;
  }
  as_stream(stream)->enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  return kCudaSuccess;
}
const char* error_string(int code) {
  switch (code) {
    case kCudaSuccess: return "no error";
    case kCudaInvalidValue: return "invalid argument";
    case kCudaMemoryAllocation: return "out of memory";
    case kCudaInvalidDevice: return "invalid device ordinal";
    case kCudaNotReady: return "device not ready";
    default: return "unknown error";
  }
}
int32_t status_of(int code) {
  switch (code) {
    case kCudaMemoryAllocation: return CASTMESH_STATUS_RESOURCE_EXHAUSTED;
    case kCudaInvalidValue: return CASTMESH_STATUS_INVALID_ARGUMENT;
    case kCudaInvalidDevice: return CASTMESH_STATUS_NO_DEVICE;
    default: return CASTMESH_STATUS_INTERNAL;
  }
}

const te_runtime_ops kFakeCuda = {
    "FakeCUDA",   kCudaNotReady,     set_device,   malloc_device,      free_device,   malloc_host,
    free_host,    stream_create,     stream_destroy, stream_query,     stream_synchronize,
    event_create, event_destroy,     event_record, event_query,        event_synchronize,
    stream_wait_event, memcpy_async, error_string, status_of,
};

}  // namespace

const te_runtime_ops* FakeCuda::ops() { return &kFakeCuda; }
void* FakeCuda::last_stream_created() { return t_last_stream; }
void FakeCuda::launch(void* stream, std::function<void()> work) {
  as_stream(stream)->enqueue(std::move(work));
}
int64_t FakeCuda::copies(int kind) { return kind >= 1 && kind <= 3 ? g_copies[kind].load() : 0; }

int64_t FakeCuda::live_device_allocations() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  return static_cast<int64_t>(g_device_memory.size());
}

}  // namespace castmesh::fakes
