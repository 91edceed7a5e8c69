// The tensor_engine backend seen from the core (device_engine.h) and the
// public device memory, stream and copy calls (castmesh/tensor_engine.h).
#include "core/tensor/device_engine.h"

#include <atomic>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/backend.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/tensor_engine.h"
#include "core/plugin/backend_registry.h"

namespace castmesh {
namespace detail {
namespace {

constexpr absl::string_view kInstallHint =
    "pip install \"castmesh[tensor-engine]\" " CASTMESH_WHEELS_HINT " (and a CUDA/ROCm driver and GPU)";

absl::StatusCode code_of(int32_t status) {
  switch (status) {
    case CASTMESH_STATUS_NO_DRIVER:
    case CASTMESH_STATUS_NO_DEVICE:
    case CASTMESH_STATUS_FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    case CASTMESH_STATUS_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case CASTMESH_STATUS_UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case CASTMESH_STATUS_RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case CASTMESH_STATUS_PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    case CASTMESH_STATUS_UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case CASTMESH_STATUS_ABORTED:
      return absl::StatusCode::kAborted;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusOr<DeviceEngine> load_engine() {
  absl::StatusOr<const Backend*> backend = load_backend("tensor_engine");
  if (!backend.ok()) return backend.status();
  DeviceEngine engine;
  engine.table = tensor_engine_table(**backend);
  if (engine.table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the tensor_engine backend at ", (*backend)->info().path,
                                                      " predates device memory and collectives (ABI 1.1); upgrade it"));
  }
  const BackendInfo& info = (*backend)->info();
  engine.device_count = static_cast<int>(info.devices.size());
  engine.version = info.version;
  engine.kind =
      !info.devices.empty() && info.devices[0].kind == CASTMESH_DEVICE_KIND_HIP ? DeviceKind::kRocm : DeviceKind::kCuda;
  return engine;
}

}  // namespace

bool is_engine_device(const Device& device) {
  return device.kind == DeviceKind::kCuda || device.kind == DeviceKind::kRocm;
}

namespace {
// The engine once loaded; a failed load is tried again at the next use.
struct LoadedEngine {
  Mutex mu;
  const DeviceEngine* engine ABSL_GUARDED_BY(mu) = nullptr;
};
}  // namespace

absl::StatusOr<const DeviceEngine*> device_engine(absl::string_view what) {
  static LoadedEngine& loaded_engine = *new LoadedEngine();  // never destroyed: used until exit
  MutexLock lock(loaded_engine.mu);
  const DeviceEngine*& loaded = loaded_engine.engine;
  if (loaded != nullptr) return loaded;
  absl::StatusOr<DeviceEngine> engine = load_engine();
  if (!engine.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " needs the tensor_engine backend (", kInstallHint,
                                                      "), which is unavailable here: ", engine.status().message()));
  }
  loaded = new DeviceEngine(*std::move(engine));  // lives as long as the backend: until exit
  return loaded;
}

absl::StatusOr<const DeviceEngine*> device_engine_for(const Device& device, absl::string_view what) {
  if (!is_engine_device(device)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is on ", device.to_string(), ", not on a CUDA or ROCm device"));
  }
  absl::StatusOr<const DeviceEngine*> engine = device_engine(what);
  if (!engine.ok()) return engine.status();
  if (device.kind != (*engine)->kind) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on ", device.to_string(),
                                                   " but the loaded tensor_engine backend drives ",
                                                   device_kind_name((*engine)->kind), " devices"));
  }
  if (device.index < 0 || device.index >= (*engine)->device_count) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on ", device.to_string(), " but the backend found ",
                                                   (*engine)->device_count, " ", device_kind_name((*engine)->kind),
                                                   " device(s)"));
  }
  return engine;
}

bool has_native_streams(const castmesh_tensor_engine_table_v1& table) {
  return table.struct_size >= offsetof(castmesh_tensor_engine_table_v1, stream_native) + sizeof table.stream_native &&
         table.stream_wrap != nullptr && table.stream_native != nullptr;
}

absl::Status backend_status(int32_t code, const castmesh_error_v1& error, absl::string_view call) {
  if (code == CASTMESH_STATUS_OK) return absl::OkStatus();
  return absl::Status(code_of(code), absl::StrCat(call, ": ", error.message));
}

namespace {
std::atomic<BlockingCallWrapper> g_blocking_call_wrapper{nullptr};
}  // namespace

void set_blocking_call_wrapper(BlockingCallWrapper wrapper) {
  g_blocking_call_wrapper.store(wrapper, std::memory_order_release);
}

absl::Status run_blocking_call(absl::FunctionRef<absl::Status()> call) {
  BlockingCallWrapper wrapper = g_blocking_call_wrapper.load(std::memory_order_acquire);
  return wrapper != nullptr ? wrapper(call) : call();
}

}  // namespace detail

// ---- DeviceStream ----

struct DeviceStream::Impl {
  const detail::DeviceEngine* engine = nullptr;
  Device device;
  castmesh_te_stream_v1* handle = nullptr;
  ~Impl() {
    castmesh_error_v1 error{};
    if (handle != nullptr) engine->table->stream_destroy(handle, &error);
  }
};

namespace detail {
namespace {

// Every live stream castmesh made or wrapped, so a DLPack export can order a
// consumer after castmesh's work on the tensor's device.
struct LiveStreams {
  Mutex mu;
  std::vector<std::weak_ptr<DeviceStream::Impl>> streams ABSL_GUARDED_BY(mu);
};
LiveStreams& live_streams() {
  static LiveStreams& live = *new LiveStreams();  // never destroyed: streams may die at exit
  return live;
}

void remember(const std::shared_ptr<DeviceStream::Impl>& impl) {
  LiveStreams& live = live_streams();
  MutexLock lock(live.mu);
  std::erase_if(live.streams, [](const std::weak_ptr<DeviceStream::Impl>& s) { return s.expired(); });
  live.streams.push_back(impl);
}

}  // namespace
}  // namespace detail

absl::StatusOr<DeviceStream> DeviceStream::Create(Device device) {
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine_for(device, "DeviceStream::Create");
  if (!engine.ok()) return engine.status();
  auto impl = std::make_shared<Impl>();
  impl->engine = *engine;
  impl->device = device;
  castmesh_error_v1 error{};
  const int32_t code = (*engine)->table->stream_create(device.index, &impl->handle, &error);
  if (code != CASTMESH_STATUS_OK) return detail::backend_status(code, error, "stream_create");
  detail::remember(impl);
  DeviceStream stream;
  stream.impl_ = std::move(impl);
  return stream;
}

absl::StatusOr<DeviceStream> DeviceStream::FromNative(Device device, uintptr_t native) {
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine_for(device, "DeviceStream::FromNative");
  if (!engine.ok()) return engine.status();
  if (!detail::has_native_streams(*(*engine)->table)) {
    return absl::FailedPreconditionError(
        "the loaded tensor_engine plugin predates native streams (its table ends at group_end), so the DLPack stream "
        "protocol is unavailable; upgrade castmesh's tensor-engine plugin (pip install -U \"castmesh[tensor-engine]\")");
  }
  auto impl = std::make_shared<Impl>();
  impl->engine = *engine;
  impl->device = device;
  castmesh_error_v1 error{};
  const int32_t code =
      (*engine)->table->stream_wrap(device.index, reinterpret_cast<void*>(native), &impl->handle, &error);
  if (code != CASTMESH_STATUS_OK) return detail::backend_status(code, error, "stream_wrap");
  detail::remember(impl);
  DeviceStream stream;
  stream.impl_ = std::move(impl);
  return stream;
}

absl::StatusOr<uintptr_t> DeviceStream::native_handle() const {
  if (impl_ == nullptr) return absl::InvalidArgumentError("native_handle of no stream (a default-made DeviceStream)");
  if (!detail::has_native_streams(*impl_->engine->table)) {
    return absl::FailedPreconditionError(
        "the loaded tensor_engine plugin predates native streams (its table ends at group_end); upgrade castmesh's "
        "tensor-engine plugin");
  }
  void* native = nullptr;
  castmesh_error_v1 error{};
  if (absl::Status st = detail::backend_status(impl_->engine->table->stream_native(impl_->handle, &native, &error),
                                               error, "stream_native");
      !st.ok()) {
    return st;
  }
  return reinterpret_cast<uintptr_t>(native);
}

Device DeviceStream::device() const { return impl_ != nullptr ? impl_->device : Device{}; }

castmesh_te_stream_v1* DeviceStream::handle() const { return impl_ != nullptr ? impl_->handle : nullptr; }

absl::Status DeviceStream::synchronize() const {
  if (impl_ == nullptr) return absl::InvalidArgumentError("synchronize on no stream (a default-made DeviceStream)");
  return detail::run_blocking_call([&] {
    castmesh_error_v1 error{};
    return detail::backend_status(impl_->engine->table->stream_synchronize(impl_->handle, &error), error,
                                  "stream_synchronize");
  });
}

absl::StatusOr<bool> DeviceStream::query() const {
  if (impl_ == nullptr) return absl::InvalidArgumentError("query on no stream (a default-made DeviceStream)");
  castmesh_error_v1 error{};
  int32_t done = 0;
  absl::Status st =
      detail::backend_status(impl_->engine->table->stream_query(impl_->handle, &done, &error), error, "stream_query");
  if (!st.ok()) return st;
  return done != 0;
}

// ---- DeviceEvent ----

struct DeviceEvent::Impl {
  const detail::DeviceEngine* engine = nullptr;
  Device device;
  castmesh_te_event_v1* handle = nullptr;
  ~Impl() {
    castmesh_error_v1 error{};
    if (handle != nullptr) engine->table->event_destroy(handle, &error);
  }
};

namespace {
absl::Status no_event(absl::string_view call) {
  return absl::InvalidArgumentError(absl::StrCat(call, " on no event (a default-made DeviceEvent)"));
}
absl::Status same_device(const Device& event, const DeviceStream& stream, absl::string_view call) {
  if (!stream.valid()) return absl::InvalidArgumentError(absl::StrCat(call, ": no stream (a default-made DeviceStream)"));
  if (stream.device() == event) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(call, ": the event is on ", event.to_string(), " but the stream on ",
                                                 stream.device().to_string()));
}
}  // namespace

absl::StatusOr<DeviceEvent> DeviceEvent::Create(Device device) {
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine_for(device, "DeviceEvent::Create");
  if (!engine.ok()) return engine.status();
  auto impl = std::make_shared<Impl>();
  impl->engine = *engine;
  impl->device = device;
  castmesh_error_v1 error{};
  const int32_t code = (*engine)->table->event_create(device.index, &impl->handle, &error);
  if (code != CASTMESH_STATUS_OK) return detail::backend_status(code, error, "event_create");
  DeviceEvent event;
  event.impl_ = std::move(impl);
  return event;
}

Device DeviceEvent::device() const { return impl_ != nullptr ? impl_->device : Device{}; }

absl::Status DeviceEvent::record(const DeviceStream& stream) const {
  if (impl_ == nullptr) return no_event("record");
  if (absl::Status st = same_device(impl_->device, stream, "record"); !st.ok()) return st;
  castmesh_error_v1 error{};
  return detail::backend_status(impl_->engine->table->event_record(impl_->handle, stream.handle(), &error), error,
                                "event_record");
}

absl::StatusOr<bool> DeviceEvent::query() const {
  if (impl_ == nullptr) return no_event("query");
  castmesh_error_v1 error{};
  int32_t done = 0;
  absl::Status st =
      detail::backend_status(impl_->engine->table->event_query(impl_->handle, &done, &error), error, "event_query");
  if (!st.ok()) return st;
  return done != 0;
}

absl::Status DeviceEvent::synchronize() const {
  if (impl_ == nullptr) return no_event("synchronize");
  return detail::run_blocking_call([&] {
    castmesh_error_v1 error{};
    return detail::backend_status(impl_->engine->table->event_synchronize(impl_->handle, &error), error,
                                  "event_synchronize");
  });
}

absl::Status DeviceEvent::order_before(const DeviceStream& stream) const {
  if (impl_ == nullptr) return no_event("order_before");
  if (absl::Status st = same_device(impl_->device, stream, "order_before"); !st.ok()) return st;
  castmesh_error_v1 error{};
  return detail::backend_status(impl_->engine->table->stream_wait_event(stream.handle(), impl_->handle, &error),
                                error, "stream_wait_event");
}

// ---- the DLPack stream protocol, producer side ----

namespace detail {
namespace {

// The events of one export: `waited` were recorded on castmesh's streams and
// are waited for by the consumer's stream; `passed` was recorded on the
// consumer's stream after those waits. Once `passed` completed nothing waits
// for `waited` any more, so all of them may be destroyed (destroying an event
// a stream still waits for is not safe on every runtime, nor in the fake).
class ExportFence {
 public:
  explicit ExportFence(const DeviceEngine* engine) : engine_(engine) {}
  ~ExportFence() {
    castmesh_error_v1 ignored{};
    for (castmesh_te_event_v1* e : waited_) engine_->table->event_destroy(e, &ignored);
    if (passed_ != nullptr) engine_->table->event_destroy(passed_, &ignored);
  }
  ExportFence(const ExportFence&) = delete;
  ExportFence& operator=(const ExportFence&) = delete;

  // `consumer` waits for the work enqueued on `producer` so far.
  absl::Status wait_for(int32_t device, castmesh_te_stream_v1* producer, castmesh_te_stream_v1* consumer) {
    const castmesh_tensor_engine_table_v1& t = *engine_->table;
    castmesh_error_v1 error{};
    castmesh_te_event_v1* event = nullptr;
    if (int32_t code = t.event_create(device, &event, &error); code != CASTMESH_STATUS_OK) {
      return backend_status(code, error, "event_create");
    }
    waited_.push_back(event);
    if (int32_t code = t.event_record(event, producer, &error); code != CASTMESH_STATUS_OK) {
      return backend_status(code, error, "event_record");
    }
    return backend_status(t.stream_wait_event(consumer, event, &error), error, "stream_wait_event");
  }
  // Marks the consumer's position after the waits.
  absl::Status seal(int32_t device, castmesh_te_stream_v1* consumer) {
    const castmesh_tensor_engine_table_v1& t = *engine_->table;
    castmesh_error_v1 error{};
    if (int32_t code = t.event_create(device, &passed_, &error); code != CASTMESH_STATUS_OK) {
      passed_ = nullptr;
      return backend_status(code, error, "event_create");
    }
    return backend_status(t.event_record(passed_, consumer, &error), error, "event_record");
  }
  // True once the consumer went past every wait (then this may be destroyed).
  bool passed() const {
    if (passed_ == nullptr) return true;
    int32_t done = 0;
    castmesh_error_v1 error{};
    return engine_->table->event_query(passed_, &done, &error) == CASTMESH_STATUS_OK && done != 0;
  }

 private:
  const DeviceEngine* engine_;
  std::vector<castmesh_te_event_v1*> waited_;
  castmesh_te_event_v1* passed_ = nullptr;
};

// Fences whose consumers may still wait; dropped once passed.
struct PendingFences {
  Mutex mu;
  std::vector<std::unique_ptr<ExportFence>> fences ABSL_GUARDED_BY(mu);
};
PendingFences& pending_fences() {
  static PendingFences& pending = *new PendingFences();  // never destroyed: fences may be pending at exit
  return pending;
}

}  // namespace
}  // namespace detail

absl::Status order_after_castmesh_work(const DeviceStream& consumer) {
  if (!consumer.valid()) return absl::InvalidArgumentError("order_after_castmesh_work: no consumer stream");
  std::vector<std::shared_ptr<DeviceStream::Impl>> producers;
  {
    detail::LiveStreams& live = detail::live_streams();
    detail::MutexLock lock(live.mu);
    for (const std::weak_ptr<DeviceStream::Impl>& weak : live.streams) {
      std::shared_ptr<DeviceStream::Impl> impl = weak.lock();
      if (impl != nullptr && impl->device == consumer.device() && impl->handle != consumer.handle()) {
        producers.push_back(std::move(impl));
      }
    }
  }
  absl::StatusOr<const detail::DeviceEngine*> engine =
      detail::device_engine_for(consumer.device(), "order_after_castmesh_work");
  if (!engine.ok()) return engine.status();
  auto fence = std::make_unique<detail::ExportFence>(*engine);
  const int32_t device = consumer.device().index;
  for (const std::shared_ptr<DeviceStream::Impl>& producer : producers) {
    if (absl::Status st = fence->wait_for(device, producer->handle, consumer.handle()); !st.ok()) return st;
  }
  if (absl::Status st = fence->seal(device, consumer.handle()); !st.ok()) return st;
  detail::PendingFences& pending = detail::pending_fences();
  detail::MutexLock lock(pending.mu);
  std::erase_if(pending.fences, [](const std::unique_ptr<detail::ExportFence>& f) { return f->passed(); });
  pending.fences.push_back(std::move(fence));
  return absl::OkStatus();
}

// ---- memory and copies ----

absl::StatusOr<std::vector<DeviceInfo>> device_list() {
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine("device_list()");
  if (!engine.ok()) return engine.status();
  absl::StatusOr<const Backend*> backend = load_backend("tensor_engine");
  if (!backend.ok()) return backend.status();
  return (*backend)->info().devices;
}

absl::StatusOr<TensorView> device_empty(DType dtype, std::vector<int64_t> shape, Device device) {
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine_for(device, "device_empty");
  if (!engine.ok()) return engine.status();
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(numel, s, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("device_empty: invalid size ", s, " in the shape"));
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(dtype), &bytes)) {
    return absl::InvalidArgumentError("device_empty: the shape's byte size overflows");
  }
  if (bytes == 0) return TensorView::Create(nullptr, dtype, std::move(shape), {}, device);
  void* ptr = nullptr;
  castmesh_error_v1 error{};
  const castmesh_tensor_engine_table_v1* table = (*engine)->table;
  const int32_t code = table->device_alloc(device.index, bytes, &ptr, &error);
  if (code != CASTMESH_STATUS_OK) return detail::backend_status(code, error, "device_alloc");
  std::shared_ptr<void> owner(ptr, [table](void* p) {
    castmesh_error_v1 ignored{};
    table->device_free(p, &ignored);
  });
  return TensorView::Create(ptr, dtype, std::move(shape), {}, device, std::move(owner));
}

absl::Status device_copy(const TensorView& dst, const TensorView& src, const DeviceStream& stream) {
  const bool src_device = detail::is_engine_device(src.device());
  const bool dst_device = detail::is_engine_device(dst.device());
  if (!src_device && !dst_device) {
    return absl::InvalidArgumentError("device_copy: neither side is device memory; copy host memory directly");
  }
  if ((!src_device && !src.device().is_cpu()) || (!dst_device && !dst.device().is_cpu())) {
    return absl::InvalidArgumentError(absl::StrCat("device_copy between ", src.device().to_string(), " and ",
                                                   dst.device().to_string(), " is not supported"));
  }
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("device_copy: destination ", dst.to_string(), " and source ",
                                                   src.to_string(), " differ in dtype or size"));
  }
  if (!dst.is_contiguous() || !src.is_contiguous()) {
    return absl::InvalidArgumentError("device_copy: both tensors must be contiguous");
  }
  if (dst.read_only()) return absl::InvalidArgumentError("device_copy: the destination is read-only");
  const Device device = src_device ? src.device() : dst.device();
  if (src_device && dst_device && src.device() != dst.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_copy from ", src.device().to_string(), " to ", dst.device().to_string(),
                     ": copies between devices are not supported; stage through the host"));
  }
  if (!stream.valid()) return absl::InvalidArgumentError("device_copy needs a stream (DeviceStream::Create)");
  if (stream.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_copy on ", device.to_string(), " given a stream of ", stream.device().to_string()));
  }
  absl::StatusOr<const detail::DeviceEngine*> engine = detail::device_engine_for(device, "device_copy");
  if (!engine.ok()) return engine.status();
  if (src.nbytes() == 0) return absl::OkStatus();
  const int32_t kind = !src_device   ? CASTMESH_TE_COPY_HOST_TO_DEVICE
                       : !dst_device ? CASTMESH_TE_COPY_DEVICE_TO_HOST
                                     : CASTMESH_TE_COPY_DEVICE_TO_DEVICE;
  castmesh_error_v1 error{};
  return detail::backend_status(
      (*engine)->table->copy(dst.data(), src.data(), src.nbytes(), kind, stream.handle(), &error), error, "copy");
}

}  // namespace castmesh
