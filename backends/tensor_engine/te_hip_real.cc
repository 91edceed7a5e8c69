// tensor_engine backend, HIP build (AMD GPUs through the ROCm/HIP runtime):
// the HIP half of the plugin. The rest (backend record, init/query_devices
// flow, the ABI 1.1 tensor_engine table over te_engine.c) is vendor-neutral
// in te_backend.c, the same code the CUDA build and the fake-runtime unit
// tests run.
//
// Links libamdhip64; on a machine without the ROCm driver or a GPU, init
// reports NO_DRIVER / NO_DEVICE with a message saying so. RCCL (NCCL's API
// and symbol names) is opened with dlopen at the first collective
// (librccl.so.1, else librccl.so; te_nccl_dlopen.c), never linked. Only C
// types cross the ABI; this file is C++ because the HIP headers are.
//
// Compile-checked only: CI has no AMD GPU, so this binding has not run on one.
#include <hip/hip_runtime_api.h>

#include <cstdio>

#include "castmesh/backend_abi.h"
#include "te_backend.h"
#include "te_ops.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

namespace {

hipStream_t as_stream(void* stream) { return static_cast<hipStream_t>(stream); }
hipEvent_t as_event(void* event) { return static_cast<hipEvent_t>(event); }

// te_runtime_ops over HIP: each entry has the contract of the function it calls.
int hip_set_device(int device) { return hipSetDevice(device); }
int hip_malloc_device(void** ptr, size_t bytes) { return hipMalloc(ptr, bytes); }
int hip_free_device(void* ptr) { return hipFree(ptr); }
int hip_malloc_host(void** ptr, size_t bytes) { return hipHostMalloc(ptr, bytes, hipHostMallocDefault); }
int hip_free_host(void* ptr) { return hipHostFree(ptr); }

int hip_stream_create(void** stream) {
  return hipStreamCreateWithFlags(reinterpret_cast<hipStream_t*>(stream), hipStreamNonBlocking);
}
int hip_stream_destroy(void* stream) { return hipStreamDestroy(as_stream(stream)); }
int hip_stream_query(void* stream) { return hipStreamQuery(as_stream(stream)); }
int hip_stream_synchronize(void* stream) { return hipStreamSynchronize(as_stream(stream)); }

int hip_event_create(void** event) {
  return hipEventCreateWithFlags(reinterpret_cast<hipEvent_t*>(event), hipEventDisableTiming);
}
int hip_event_destroy(void* event) { return hipEventDestroy(as_event(event)); }
int hip_event_record(void* event, void* stream) { return hipEventRecord(as_event(event), as_stream(stream)); }
int hip_event_query(void* event) { return hipEventQuery(as_event(event)); }
int hip_event_synchronize(void* event) { return hipEventSynchronize(as_event(event)); }
int hip_stream_wait_event(void* stream, void* event) {
  return hipStreamWaitEvent(as_stream(stream), as_event(event), 0);
}

int hip_memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  hipMemcpyKind hip_kind = hipMemcpyDeviceToDevice;
  if (kind == CASTMESH_TE_COPY_HOST_TO_DEVICE) hip_kind = hipMemcpyHostToDevice;
  if (kind == CASTMESH_TE_COPY_DEVICE_TO_HOST) hip_kind = hipMemcpyDeviceToHost;
  return hipMemcpyAsync(dst, src, bytes, hip_kind, as_stream(stream));
}

const char* hip_error_string(int code) { return hipGetErrorString(static_cast<hipError_t>(code)); }

int32_t hip_status_of(int code) {
  switch (static_cast<hipError_t>(code)) {
    case hipErrorOutOfMemory:
      return CASTMESH_STATUS_RESOURCE_EXHAUSTED;
    case hipErrorInvalidValue:
    case hipErrorInvalidHandle:
      return CASTMESH_STATUS_INVALID_ARGUMENT;
    case hipErrorInvalidDevice:
    case hipErrorNoDevice:
      return CASTMESH_STATUS_NO_DEVICE;
    case hipErrorInsufficientDriver:
      return CASTMESH_STATUS_NO_DRIVER;
    default:
      return CASTMESH_STATUS_INTERNAL;
  }
}

const te_runtime_ops kHipRuntime = {
    "HIP",
    hipErrorNotReady,
    hip_set_device,
    hip_malloc_device,
    hip_free_device,
    hip_malloc_host,
    hip_free_host,
    hip_stream_create,
    hip_stream_destroy,
    hip_stream_query,
    hip_stream_synchronize,
    hip_event_create,
    hip_event_destroy,
    hip_event_record,
    hip_event_query,
    hip_event_synchronize,
    hip_stream_wait_event,
    hip_memcpy_async,
    hip_error_string,
    hip_status_of,
};

// The device probe te_backend.c's init and query_devices run.
void hip_versions(int* driver, int* runtime) {
  (void)hipRuntimeGetVersion(runtime);
  (void)hipDriverGetVersion(driver);
}

int hip_device_count(int* count) { return hipGetDeviceCount(count); }

int32_t hip_driver_failure(int driver, int runtime, int code, castmesh_error_v1* error) {
  return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
                 "no usable HIP driver (driver %d, runtime %d: %s); install the ROCm kernel driver (amdgpu) and "
                 "runtime",
                 driver, runtime, hip_error_string(code));
}

int hip_describe_device(int index, castmesh_device_info_v1* out) {
  hipDeviceProp_t prop{};
  const hipError_t status = hipGetDeviceProperties(&prop, index);
  if (status != hipSuccess) return status;
  std::snprintf(out->name, sizeof out->name, "%.127s", prop.name);
  out->memory_bytes = static_cast<uint64_t>(prop.totalGlobalMem);
  std::snprintf(out->detail, sizeof out->detail,
                "arch=%.64s compute_capability=%d.%d multiprocessors=%d pci=%04x:%02x:%02x", prop.gcnArchName,
                prop.major, prop.minor, prop.multiProcessorCount, static_cast<unsigned>(prop.pciDomainID),
                static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
  return hipSuccess;
}

// RCCL: ROCm's soname first, then the unversioned link some installs ship.
const char* const kRcclLibraries[] = {TE_RCCL_LIBRARY, TE_RCCL_LIBRARY_LINK, nullptr};

const te_vendor kHipVendor = {
    .version = CASTMESH_BACKEND_VERSION "+hip",
    .device_kind = CASTMESH_DEVICE_KIND_HIP,
    .runtime = &kHipRuntime,
    .load_collectives = te_nccl_dlopen,
    .collective_libraries = kRcclLibraries,
    .collective_hint = TE_RCCL_INSTALL_HINT,
    .versions = hip_versions,
    .device_count = hip_device_count,
    .device_count_call = "hipGetDeviceCount",
    .no_device_code = hipErrorNoDevice,
    .driver_failure = hip_driver_failure,
    .describe_device = hip_describe_device,
    .describe_device_call = "hipGetDeviceProperties",
};

}  // namespace

extern "C" CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(
    const castmesh_host_api_v1* host) {
  return te_backend_init(&kHipVendor, host);
}
