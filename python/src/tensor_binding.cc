// castmesh.Tensor and the Python side of castmesh/tensor.h: DLPack capsules
// in both directions, the buffer protocol, and the helpers in tensor_binding.h.
#include "tensor_binding.h"

#include <pybind11/stl.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/tensor_engine.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kUsedVersionedName = "used_dltensor_versioned";
constexpr const char* kLegacyName = "dltensor";
constexpr const char* kUsedLegacyName = "used_dltensor";

// Status -> the exceptions array consumers expect (ErrorDomain::kTensor):
// ValueError for bad values, MemoryError, and BufferError for what castmesh
// cannot import or export.
[[noreturn]] void raise_status(const absl::Status& status) { throw_status(status, ErrorDomain::kTensor); }

template <typename T>
T value_or_raise(absl::StatusOr<T> value) {
  return value_or_throw(std::move(value), ErrorDomain::kTensor);
}

// A view's sizes or strides as a Python tuple of ints.
py::tuple tuple_of(absl::Span<const int64_t> dims) {
  py::tuple t(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t[i] = py::int_(dims[i]);
  return t;
}

// "ndarray", "bytes": names the offending object in messages.
std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__qualname__")); }

// Whether `obj` is a castmesh.Tensor. A plain type check: py::isinstance
// looks the class up by its C++ type and asks the metaclass for
// __instancecheck__ (both in perf of a 1 KiB allreduce from Python).
bool is_castmesh_tensor(py::handle obj) {
  static PyTypeObject* type = nullptr;  // castmesh.Tensor lives until exit; the GIL orders the first calls
  if (type == nullptr) type = reinterpret_cast<PyTypeObject*>(py::type::of<TensorView>().ptr());
  return PyObject_TypeCheck(obj.ptr(), type);
}

// --- owners that hold Python references ------------------------------------

// What a view made from a Python object keeps: the object, and either the
// imported DLPack tensor's owner or a Py_buffer. Released with the GIL: at
// once where the dropping thread holds it, else queued for the HoldReleaser.
struct PythonHold {
  py::object object;
  std::shared_ptr<void> dlpack;
  std::optional<Py_buffer> buffer;
};

void release_now(PythonHold* held) {  // with the GIL
  held->dlpack.reset();
  if (held->buffer) PyBuffer_Release(&*held->buffer);
  delete held;
}

// Releases holds dropped on threads that do not hold the GIL. A castmesh I/O
// or timer thread must never wait for the GIL (the thread holding it may be
// waiting for that very thread), so it queues them here. The next call into
// the bindings releases them (it holds the GIL anyway); a thread of our own
// does it only if no such call comes within kGrace. Waking that thread per
// drop made every collective from Python pay a GIL hand-off to it (21-33 us
// per 1 KiB allreduce, bench/RESULTS.md).
class HoldReleaser {
 public:
  static HoldReleaser& instance() {
    static auto* releaser = new HoldReleaser;  // leaked: its thread runs until exit
    return *releaser;
  }
  // Any thread without the GIL.
  void push(PythonHold* held) {
    bool wake = false;
    {
      detail::MutexLock lock(mu_);
      queue_.push_back(held);
      queued_.store(true, std::memory_order_relaxed);
      wake = thread_waiting_;
    }
    if (wake) cv_.notify_one();
  }
  // With the GIL: releases what is queued; one relaxed load when nothing is.
  void release_queued() {
    if (!queued_.load(std::memory_order_relaxed)) return;
    for (PythonHold* held : take()) release_now(held);
  }

 private:
  static constexpr auto kGrace = std::chrono::milliseconds(2);

  HoldReleaser() { std::thread([this] { run(); }).detach(); }
  std::vector<PythonHold*> take() {
    std::vector<PythonHold*> batch;
    detail::MutexLock lock(mu_);
    batch.swap(queue_);
    queued_.store(false, std::memory_order_relaxed);
    return batch;
  }
  void run() {
    for (;;) {
      {
        detail::MutexLock lock(mu_);
        thread_waiting_ = true;
        cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); });
        thread_waiting_ = false;
      }
      std::this_thread::sleep_for(kGrace);
      std::vector<PythonHold*> batch = take();
      // Once the interpreter exits the Python memory is gone anyway, and
      // taking the GIL during finalization would end this thread (see
      // python_usable): leak them.
      if (batch.empty() || !python_usable()) continue;
      py::gil_scoped_acquire gil;
      for (PythonHold* held : batch) release_now(held);
    }
  }
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::vector<PythonHold*> queue_ ABSL_GUARDED_BY(mu_);
  bool thread_waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> queued_{false};  // queue_ may be non-empty: a hint read without mu_
};

std::shared_ptr<void> hold(PythonHold* held) {
  return std::shared_ptr<void>(held, [](void* p) {
    auto* h = static_cast<PythonHold*>(p);
    if (!python_usable()) return;  // exiting: leak (see HoldReleaser::run)
    if (PyGILState_Check()) return release_now(h);
    HoldReleaser::instance().push(h);
  });
}

// --- import: DLPack --------------------------------------------------------

// Consumes a DLPack capsule (renaming it "used_..." so its destructor leaves
// the tensor alone) and views it.
TensorView view_of_capsule(py::handle capsule, py::handle producer) {
  PyObject* cap = capsule.ptr();
  absl::StatusOr<TensorView> view;
  if (PyCapsule_IsValid(cap, kVersionedName)) {
    auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
    PyCapsule_SetName(cap, kUsedVersionedName);
    view = TensorView::FromDLPack(managed);
  } else if (PyCapsule_IsValid(cap, kLegacyName)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
    PyCapsule_SetName(cap, kUsedLegacyName);
    view = TensorView::FromDLPack(managed);
  } else {
    throw py::type_error(type_name(producer) + ".__dlpack__() returned a " + type_name(capsule) +
                         ", not an unconsumed 'dltensor_versioned' or 'dltensor' capsule");
  }
  if (!view.ok()) raise_status(view.status());
  auto* held = new PythonHold{py::reinterpret_borrow<py::object>(producer), view->owner(), std::nullopt};
  return view->with_owner(hold(held));
}

// The capsule from obj.__dlpack__, versioned when the producer can; `stream`
// (None for host producers) is DLPack's stream argument.
py::object dlpack_capsule(py::handle obj, const py::object& stream) {
  py::object method = obj.attr("__dlpack__");
  try {
    if (stream.is_none()) {
      return method(py::arg("max_version") = py::make_tuple(kDLPackMajorVersion, kDLPackMinorVersion));
    }
    return method(py::arg("stream") = stream,
                  py::arg("max_version") = py::make_tuple(kDLPackMajorVersion, kDLPackMinorVersion));
  } catch (py::error_already_set& error) {
    // Producers older than DLPack 1.0 do not know max_version.
    if (!error.matches(PyExc_TypeError)) throw;
  }
  return stream.is_none() ? method() : method(py::arg("stream") = stream);
}

// The CUDA/ROCm device of a DLPack producer that says so through
// __dlpack_device__ (host producers and castmesh.Tensor: none).
std::optional<Device> producer_device(py::handle obj) {
  if (is_castmesh_tensor(obj) || !py::hasattr(obj, "__dlpack_device__")) return std::nullopt;
  py::tuple where = obj.attr("__dlpack_device__")();
  const int32_t kind = where[0].cast<int32_t>();
  if (kind != static_cast<int32_t>(DeviceKind::kCuda) && kind != static_cast<int32_t>(DeviceKind::kRocm)) {
    return std::nullopt;
  }
  return Device{static_cast<DeviceKind>(kind), where[1].cast<int>()};
}

// castmesh's stream for consuming device arrays on `device` when the caller
// named none (one per device, made at first use, kept until exit), or no
// stream without a usable tensor_engine backend. Under the GIL.
DeviceStream consume_stream(const Device& device) {
  static auto& streams = *new std::map<std::pair<int, int>, DeviceStream>();  // used until exit
  const std::pair<int, int> key{static_cast<int>(device.kind), device.index};
  auto it = streams.find(key);
  if (it != streams.end()) return it->second;
  absl::StatusOr<DeviceStream> made = DeviceStream::Create(device);
  if (!made.ok()) return DeviceStream();
  return streams.emplace(key, *made).first->second;
}

// DLPack's stream argument for a CUDA/ROCm producer on `device`: the native
// handle of the stream castmesh will use (*stream, or the consume stream,
// which is then stored into *stream), so the producer orders its pending work
// before castmesh's. None without the backend: castmesh cannot touch the
// memory then, and whatever uses the view reports the missing backend.
py::object consumer_stream_argument(const Device& device, DeviceStream* stream) {
  if (!stream->valid()) *stream = consume_stream(device);
  if (!stream->valid()) return py::none();
  if (stream->device() != device) {
    throw py::value_error("the array is on " + device.to_string() + " but the stream is on " +
                          stream->device().to_string() + "; pass a stream of the array's device");
  }
  absl::StatusOr<uintptr_t> native = stream->native_handle();
  if (!native.ok()) raise_status(native.status());
  return py::int_(*native);
}

// --- import: buffer protocol ------------------------------------------------

// The DType of a struct-module format of `itemsize` bytes (native or
// explicit native byte order), if castmesh has it.
std::optional<DType> dtype_of_format(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format == nullptr ? "B" : format;  // null format means unsigned bytes
  constexpr bool kLittle = std::endian::native == std::endian::little;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || (f[0] == '<' && kLittle) || ((f[0] == '>' || f[0] == '!') && !kLittle))) {
    f.remove_prefix(1);
  }
  if (f.size() != 1) return std::nullopt;
  // A switch, not a search of code strings per dtype: this runs on every
  // import (nine memchr calls per 1 KiB allreduce from Python under callgrind).
  auto floating = [itemsize]() -> std::optional<DType> {
    switch (itemsize) {
      case 2: return DType::kFloat16;
      case 4: return DType::kFloat32;
      case 8: return DType::kFloat64;
      default: return std::nullopt;
    }
  };
  auto integer = [&](bool is_signed) -> std::optional<DType> {
    switch (itemsize) {
      case 1: return is_signed ? DType::kInt8 : DType::kUInt8;
      case 2: return is_signed ? DType::kInt16 : DType::kUInt16;
      case 4: return is_signed ? DType::kInt32 : DType::kUInt32;
      case 8: return is_signed ? DType::kInt64 : DType::kUInt64;
      default: return std::nullopt;
    }
  };
  switch (f[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': return integer(true);
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': return integer(false);
    case 'e': case 'f': case 'd': return floating();
    case '?': return itemsize == 1 ? std::optional<DType>(DType::kBool) : std::nullopt;
    default: return std::nullopt;
  }
}

// Views `obj` through the buffer protocol. A refused buffer or a format
// castmesh has no dtype for is an error, or, with `or_nothing`, nullopt (the
// caller tries DLPack).
std::optional<TensorView> view_of_buffer(py::handle obj, bool writable, bool or_nothing) {
  auto* held = new PythonHold{py::reinterpret_borrow<py::object>(obj), nullptr, Py_buffer{}};
  if (PyObject_GetBuffer(obj.ptr(), &*held->buffer, PyBUF_RECORDS_RO) != 0) {
    py::error_already_set error;  // fetched before the object is let go
    held->buffer.reset();
    delete held;
    // Device arrays may offer a buffer that refuses CPU access (CuPy raises
    // TypeError): the caller then tries their DLPack export.
    if (or_nothing) return std::nullopt;
    throw error;
  }
  std::shared_ptr<void> owner = hold(held);  // from here every exit releases the buffer
  const Py_buffer& b = *held->buffer;
  if (writable && b.readonly) {
    throw py::buffer_error("castmesh needs to write into this " + type_name(obj) + ", but its buffer is read-only");
  }
  std::optional<DType> dtype = dtype_of_format(b.format, b.itemsize);
  if (!dtype && or_nothing) return std::nullopt;
  if (!dtype) {
    throw py::buffer_error("buffer format '" + std::string(b.format ? b.format : "B") + "' (itemsize " +
                           std::to_string(b.itemsize) + ") of " + type_name(obj) + " is not a castmesh dtype");
  }
  // TensorView::Dims keeps small ranks in place, so the import allocates no
  // shape or strides. Null strides mean C-contiguous (PEP 3118; ctypes
  // arrays export them so even when strides were asked for: reading them
  // crashed), and a null shape a 1-D run of bytes.
  TensorView::Dims shape;
  if (b.shape != nullptr) {
    shape.assign(b.shape, b.shape + b.ndim);
  } else if (b.ndim > 0) {
    shape.push_back(b.len / b.itemsize);
  }
  TensorView::Dims strides;  // empty: C-contiguous
  for (int i = 0; b.strides != nullptr && i < b.ndim; ++i) {
    if (b.strides[i] % b.itemsize != 0) {
      throw py::buffer_error("stride " + std::to_string(b.strides[i]) + " bytes of " + type_name(obj) +
                             " is not a multiple of its itemsize " + std::to_string(b.itemsize));
    }
    strides.push_back(b.strides[i] / b.itemsize);
  }
  return value_or_raise(TensorView::Create(b.buf, *dtype, shape, strides, Device{}, std::move(owner), b.readonly != 0));
}

TensorView checked_writable(TensorView view, py::handle obj, bool writable) {
  if (writable && view.read_only()) {
    throw py::buffer_error("castmesh needs to write into this " + type_name(obj) +
                           ", but it is read-only (DLPack read-only flag)");
  }
  return view;
}

// --- export: DLPack ---------------------------------------------------------

// Capsule destructors: a capsule still carrying its original name was never
// consumed, so it still owns the tensor.
void delete_unused_versioned(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kVersionedName)) return;
  auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedName));
  if (managed->deleter != nullptr) managed->deleter(managed);
}

void delete_unused_legacy(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kLegacyName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyName));
  if (managed->deleter != nullptr) managed->deleter(managed);
}

template <typename Managed>
py::object capsule_of(Managed* managed, const char* name, PyCapsule_Destructor destructor) {
  PyObject* capsule = PyCapsule_New(managed, name, destructor);
  if (capsule == nullptr) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

// The view a consumer asked for with dl_device: ours, or ours relabelled as
// CPU memory when the CPU may address it (pinned/managed memory).
TensorView on_requested_device(const TensorView& view, py::handle dl_device) {
  if (dl_device.is_none()) return view;
  auto requested = dl_device.cast<std::pair<int32_t, int32_t>>();
  const Device ours = view.device();
  if (requested.first == static_cast<int32_t>(ours.kind) && requested.second == ours.index) return view;
  if (requested.first == kDLCPU && ours.is_host_accessible()) {
    return value_or_raise(TensorView::Create(view.data(), view.dtype(), view.shape(), view.strides(), Device{},
                                             view.owner(), view.read_only()));
  }
  throw py::buffer_error("a castmesh.Tensor on " + ours.to_string() + " cannot be exported to DLPack device (" +
                         std::to_string(requested.first) + ", " + std::to_string(requested.second) + ")");
}

// The producer half of the DLPack stream protocol: the consumer's stream
// (DLPack's integer: None means CUDA's legacy default stream or HIP's null
// stream, -1 no ordering) waits for castmesh's pending work on the tensor's
// device. Host tensors have nothing pending.
void order_consumer_after_castmesh(const TensorView& view, py::handle stream) {
  const Device device = view.device();
  if (device.kind != DeviceKind::kCuda && device.kind != DeviceKind::kRocm) return;
  int64_t native = device.kind == DeviceKind::kCuda ? 1 : 0;
  if (!stream.is_none()) {
    if (!py::isinstance<py::int_>(stream)) {
      throw py::type_error("__dlpack__(stream=...) takes an integer (the consumer's native stream), not " +
                           type_name(stream));
    }
    native = stream.cast<int64_t>();
  }
  if (native == -1) return;  // the consumer orders the work itself
  if (native == 0 && device.kind == DeviceKind::kCuda) {
    throw py::value_error(
        "__dlpack__(stream=0) is ambiguous for CUDA (DLPack forbids it): pass 1 for the legacy default stream, 2 for "
        "the per-thread default stream, or the stream's handle");
  }
  if (native < -1) throw py::value_error("__dlpack__(stream=" + std::to_string(native) + "): not a stream");
  absl::StatusOr<DeviceStream> consumer = DeviceStream::FromNative(device, static_cast<uintptr_t>(native));
  if (!consumer.ok()) raise_status(consumer.status());
  if (absl::Status st = order_after_castmesh_work(*consumer); !st.ok()) raise_status(st);
}

// Tensor.__dlpack__: `stream` is the consumer's stream (DLPack's integer);
// for device memory it waits for castmesh's pending work first.
py::object export_dlpack(const TensorView& self, py::handle stream, py::handle max_version, py::handle dl_device,
                         py::handle copy) {
  order_consumer_after_castmesh(self, stream);
  TensorView view = on_requested_device(self, dl_device);
  const bool copied = !copy.is_none() && copy.cast<bool>();
  if (copied) view = value_or_raise(view.ContiguousCopy());
  const bool versioned = !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
  if (versioned) {
    DLManagedTensorVersioned* managed = view.to_dlpack_versioned();
    if (copied) managed->flags |= kDLPackFlagBitmaskIsCopied;
    return capsule_of(managed, kVersionedName, &delete_unused_versioned);
  }
  if (view.read_only()) {
    throw py::buffer_error(
        "a read-only castmesh.Tensor cannot be exported as a legacy DLPack capsule, which has no read-only "
        "flag; the consumer must pass max_version=(1, 0) or copy=True");
  }
  return capsule_of(view.to_dlpack_legacy(), kLegacyName, &delete_unused_legacy);
}

// --- castmesh.Tensor --------------------------------------------------------

float half_to_float(uint16_t half) {
  const uint32_t sign = (half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 0x1f ? (sign | 0x7f800000u | (mantissa << 13))  // inf, nan
                                         : (sign | ((exponent + 112) << 23) | (mantissa << 13));
  return std::bit_cast<float>(bits);
}

template <typename T>
T load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

py::object element(const char* p, DType dtype) {
  switch (dtype) {
    case DType::kInt8: return py::int_(load<int8_t>(p));
    case DType::kInt16: return py::int_(load<int16_t>(p));
    case DType::kInt32: return py::int_(load<int32_t>(p));
    case DType::kInt64: return py::int_(load<int64_t>(p));
    case DType::kUInt8: return py::int_(load<uint8_t>(p));
    case DType::kUInt16: return py::int_(load<uint16_t>(p));
    case DType::kUInt32: return py::int_(load<uint32_t>(p));
    case DType::kUInt64: return py::int_(load<uint64_t>(p));
    case DType::kFloat16: return py::float_(half_to_float(load<uint16_t>(p)));
    case DType::kBFloat16: return py::float_(std::bit_cast<float>(uint32_t{load<uint16_t>(p)} << 16));
    case DType::kFloat32: return py::float_(load<float>(p));
    case DType::kFloat64: return py::float_(load<double>(p));
    case DType::kBool: return py::bool_(load<uint8_t>(p) != 0);
  }
  throw py::value_error("invalid dtype");
}

py::object nested_list(const TensorView& view, const char* p, size_t dim) {
  if (dim == view.shape().size()) return element(p, view.dtype());
  py::list items;
  const int64_t step = view.strides()[dim] * static_cast<int64_t>(view.itemsize());
  for (int64_t i = 0; i < view.shape()[dim]; ++i) items.append(nested_list(view, p + i * step, dim + 1));
  return items;
}

py::object to_list(const TensorView& view) {
  if (!view.device().is_host_accessible()) {
    throw py::buffer_error("tolist() of a castmesh.Tensor on " + view.device().to_string() + " needs host memory");
  }
  return nested_list(view, static_cast<const char*>(view.data()), 0);
}

std::string repr(const TensorView& view) {
  std::string text = "castmesh.Tensor(";
  if (view.numel() <= 64 && view.device().is_host_accessible()) {
    text += py::repr(to_list(view)).cast<std::string>() + ", ";
  } else {
    text += "shape=" + py::repr(tuple_of(view.shape())).cast<std::string>() + ", ";
  }
  text += "dtype='" + std::string(dtype_name(view.dtype())) + "'";
  if (!view.device().is_cpu()) text += ", device='" + view.device().to_string() + "'";
  if (view.read_only()) text += ", read_only=True";
  return text + ")";
}

// struct-module format of a dtype for the buffer protocol; bfloat16 has none.
const char* buffer_format(DType dtype) {
  switch (dtype) {
    case DType::kInt8: return "b";
    case DType::kInt16: return "h";
    case DType::kInt32: return "i";
    case DType::kInt64: return "q";
    case DType::kUInt8: return "B";
    case DType::kUInt16: return "H";
    case DType::kUInt32: return "I";
    case DType::kUInt64: return "Q";
    case DType::kFloat16: return "e";
    case DType::kFloat32: return "f";
    case DType::kFloat64: return "d";
    case DType::kBool: return "?";
    case DType::kBFloat16: break;
  }
  throw py::buffer_error("bfloat16 has no buffer-protocol format; exchange it through DLPack (__dlpack__)");
}

py::buffer_info buffer_of(const TensorView& view) {
  if (!view.device().is_host_accessible()) {
    throw py::buffer_error("a castmesh.Tensor on " + view.device().to_string() + " has no CPU buffer");
  }
  // The buffer protocol wants a real address even for no elements.
  static char empty_storage[64];
  void* data = view.data() != nullptr ? view.data() : empty_storage;
  const auto itemsize = static_cast<py::ssize_t>(view.itemsize());
  std::vector<py::ssize_t> strides;
  for (int64_t s : view.strides()) strides.push_back(s * itemsize);
  return py::buffer_info(data, itemsize, buffer_format(view.dtype()), view.ndim(),
                         std::vector<py::ssize_t>(view.shape().begin(), view.shape().end()), std::move(strides),
                         view.read_only());
}

DType dtype_named(const std::string& name) {
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype) {
    throw py::type_error("unknown castmesh dtype '" + name +
                         "' (int8-64, uint8-64, float16, bfloat16, float32, float64, bool)");
  }
  return *dtype;
}

// Pickled as (dtype name, shape, C-order bytes), so tensors travel as actor
// arguments and results; the unpickled tensor is a fresh writable copy.
py::tuple pickled(const TensorView& view) {
  TensorView dense = view.is_contiguous() ? view : value_or_raise(view.ContiguousCopy());
  if (!dense.device().is_host_accessible()) {
    throw py::buffer_error("a castmesh.Tensor on " + dense.device().to_string() + " cannot be pickled");
  }
  const char* bytes = dense.numel() > 0 ? static_cast<const char*>(dense.data()) : "";
  return py::make_tuple(std::string(dtype_name(dense.dtype())), tuple_of(dense.shape()),
                        py::bytes(bytes, dense.nbytes()));
}

TensorView unpickled(const py::tuple& state) {
  if (state.size() != 3) throw py::value_error("castmesh.Tensor pickle state must be (dtype, shape, bytes)");
  TensorView view = value_or_raise(
      TensorView::TryAllocate(dtype_named(state[0].cast<std::string>()), state[1].cast<std::vector<int64_t>>()));
  const std::string_view bytes = state[2].cast<std::string_view>();
  if (bytes.size() != view.nbytes()) {
    throw py::value_error("castmesh.Tensor pickle holds " + std::to_string(bytes.size()) + " bytes for " +
                          std::to_string(view.nbytes()));
  }
  if (!bytes.empty()) std::memcpy(view.data(), bytes.data(), bytes.size());
  return view;
}

void bind_tensor_class(py::module_& module) {
  py::class_<TensorView>(module, "Tensor", py::buffer_protocol(),
                         "A castmesh-owned or zero-copy array (castmesh::TensorView); a DLPack producer with the "
                         "buffer protocol. Make one with castmesh.from_dlpack, castmesh.empty or castmesh.zeros.")
      .def_buffer(&buffer_of)
      .def_property_readonly("shape", [](const TensorView& v) { return tuple_of(v.shape()); })
      .def_property_readonly("dtype", [](const TensorView& v) { return std::string(dtype_name(v.dtype())); })
      .def_property_readonly("strides", [](const TensorView& v) { return tuple_of(v.strides()); },
                             "Strides in elements (NumPy's are in bytes).")
      .def_property_readonly("byte_offset", &TensorView::byte_offset)
      .def_property_readonly("device", [](const TensorView& v) { return v.device().to_string(); })
      .def_property_readonly("ndim", &TensorView::ndim)
      .def_property_readonly("size", &TensorView::numel, "Number of elements.")
      .def_property_readonly("itemsize", &TensorView::itemsize)
      .def_property_readonly("nbytes", &TensorView::nbytes)
      .def_property_readonly("read_only", &TensorView::read_only)
      .def_property_readonly("is_contiguous", &TensorView::is_contiguous)
      .def_property_readonly("data_ptr", [](const TensorView& v) { return reinterpret_cast<uintptr_t>(v.data()); },
                             "Address of the first element.")
      .def("tolist", &to_list, "The elements as nested Python lists (a scalar for 0-d).")
      .def("copy", [](const TensorView& v) { return value_or_raise(v.ContiguousCopy()); },
           "A writable C-contiguous copy in castmesh-owned memory.")
      .def("__len__",
           [](const TensorView& v) {
             if (v.ndim() == 0) throw py::type_error("len() of a 0-d castmesh.Tensor");
             return v.shape()[0];
           })
      .def("__repr__", &repr)
      .def(py::pickle(&pickled, &unpickled))
      .def("__dlpack__", &export_dlpack, py::arg("stream") = py::none(), py::kw_only(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "A DLPack capsule: 'dltensor_versioned' when max_version >= (1, 0), else the legacy 'dltensor'.")
      .def("__dlpack_device__",
           [](const TensorView& v) { return py::make_tuple(static_cast<int32_t>(v.device().kind), v.device().index); },
           "(DLPack device type, device index).");
}

}  // namespace

TensorView tensor_from_python(py::handle obj, bool writable) {
  DeviceStream none;
  return tensor_from_python(obj, writable, &none);
}

TensorView tensor_from_python(py::handle obj, bool writable, DeviceStream* stream) {
  HoldReleaser::instance().release_queued();
  if (is_castmesh_tensor(obj)) return checked_writable(obj.cast<TensorView>(), obj, writable);
  // Host arrays with the buffer protocol (NumPy, bytearray, memoryview) take
  // it first: the same zero-copy view from one C call, where __dlpack__ costs
  // attribute lookups, keyword calls and a capsule (about 2 us of the 3 us a
  // 1-rank allreduce took from Python). Device arrays offer no buffer, or one
  // that refuses CPU access (CuPy), and go on to DLPack.
  if (PyObject_CheckBuffer(obj.ptr())) {
    if (std::optional<TensorView> view = view_of_buffer(obj, writable, /*or_nothing=*/true)) return *std::move(view);
  }
  if (py::hasattr(obj, "__dlpack__")) {
    std::optional<Device> device = producer_device(obj);
    py::object stream_argument = device ? consumer_stream_argument(*device, stream) : py::none();
    try {
      py::object capsule = dlpack_capsule(obj, stream_argument);
      return checked_writable(view_of_capsule(capsule, obj), obj, writable);
    } catch (py::error_already_set& error) {
      // A legacy producer refuses read-only arrays; their buffer still works.
      if (!error.matches(PyExc_BufferError) || !PyObject_CheckBuffer(obj.ptr())) throw;
    }
  }
  if (PyObject_CheckBuffer(obj.ptr())) return *view_of_buffer(obj, writable, /*or_nothing=*/false);
  throw py::type_error("castmesh needs an array: " + type_name(obj) +
                       " has neither __dlpack__ nor the buffer protocol");
}

py::object tensor_to_python(TensorView view) { return py::cast(std::move(view)); }

void bind_tensor(py::module_& module) {
  bind_tensor_class(module);
  module.def(
      "as_tensor",
      [](py::handle obj, bool writable, const py::object& stream) {
        DeviceStream consumer = stream.is_none() ? DeviceStream() : stream.cast<DeviceStream>();
        return tensor_to_python(tensor_from_python(obj, writable, &consumer));
      },
      py::arg("obj"), py::arg("writable") = false, py::arg("stream") = py::none(),
      "Zero-copy castmesh.Tensor of any DLPack or buffer-protocol object (a NumPy array without importing NumPy); "
      "a CUDA/ROCm producer is asked with __dlpack__(stream=) naming `stream` (a castmesh.tensor_engine.Stream; "
      "default: castmesh's consume stream of that device).");
  module.def(
      "allocate_tensor",
      [](const std::vector<int64_t>& shape, const std::string& dtype) {
        return value_or_raise(TensorView::TryAllocate(dtype_named(dtype), shape));
      },
      py::arg("shape"), py::arg("dtype"), "Zeroed, 64-byte aligned castmesh-owned CPU memory.");
}

}  // namespace castmesh::python
