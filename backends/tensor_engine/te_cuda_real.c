/* tensor_engine backend, CUDA build: the CUDA half of the plugin. The rest
 * (backend record, init/query_devices flow, the ABI 1.1 tensor_engine table
 * over te_engine.c) is vendor-neutral in te_backend.c.
 *
 * Linked against the static CUDA runtime (libcudart_static.a), which finds the
 * driver (libcuda.so.1) with dlopen at run time: this library loads on any
 * machine, and a machine without driver or GPU gets NO_DRIVER / NO_DEVICE from
 * init with a message saying so. NCCL is opened with dlopen at the first
 * collective (te_nccl_dlopen.c; never linked, never bundled).
 *
 * Here: te_runtime_ops over the CUDA runtime (each entry converts handles from
 * void* to the runtime's types), the device probe, and the entry point. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "castmesh/backend_abi.h"
#include "te_backend.h"
#include "te_ops.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

static int cuda_set_device(int device) { return (int)cudaSetDevice(device); }
static int cuda_malloc_device(void** ptr, size_t bytes) { return (int)cudaMalloc(ptr, bytes); }
static int cuda_free_device(void* ptr) { return (int)cudaFree(ptr); }
static int cuda_malloc_host(void** ptr, size_t bytes) { return (int)cudaMallocHost(ptr, bytes); }
static int cuda_free_host(void* ptr) { return (int)cudaFreeHost(ptr); }

static int cuda_stream_create(void** stream) {
  return (int)cudaStreamCreateWithFlags((cudaStream_t*)stream, cudaStreamNonBlocking);
}
static int cuda_stream_destroy(void* stream) { return (int)cudaStreamDestroy((cudaStream_t)stream); }
static int cuda_stream_query(void* stream) { return (int)cudaStreamQuery((cudaStream_t)stream); }
static int cuda_stream_synchronize(void* stream) { return (int)cudaStreamSynchronize((cudaStream_t)stream); }

static int cuda_event_create(void** event) {
  return (int)cudaEventCreateWithFlags((cudaEvent_t*)event, cudaEventDisableTiming);
}
static int cuda_event_destroy(void* event) { return (int)cudaEventDestroy((cudaEvent_t)event); }
static int cuda_event_record(void* event, void* stream) {
  return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
}
static int cuda_event_query(void* event) { return (int)cudaEventQuery((cudaEvent_t)event); }
static int cuda_event_synchronize(void* event) { return (int)cudaEventSynchronize((cudaEvent_t)event); }
static int cuda_stream_wait_event(void* stream, void* event) {
  return (int)cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
}

static int cuda_memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  enum cudaMemcpyKind cuda_kind = cudaMemcpyDeviceToDevice;
  if (kind == CASTMESH_TE_COPY_HOST_TO_DEVICE) cuda_kind = cudaMemcpyHostToDevice;
  if (kind == CASTMESH_TE_COPY_DEVICE_TO_HOST) cuda_kind = cudaMemcpyDeviceToHost;
  return (int)cudaMemcpyAsync(dst, src, bytes, cuda_kind, (cudaStream_t)stream);
}

static const char* cuda_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

static int32_t cuda_status_of(int code) {
  switch ((cudaError_t)code) {
    case cudaErrorMemoryAllocation:
      return CASTMESH_STATUS_RESOURCE_EXHAUSTED;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
      return CASTMESH_STATUS_INVALID_ARGUMENT;
    case cudaErrorInvalidDevice:
    case cudaErrorNoDevice:
      return CASTMESH_STATUS_NO_DEVICE;
    case cudaErrorInsufficientDriver:
      return CASTMESH_STATUS_NO_DRIVER;
    default:
      return CASTMESH_STATUS_INTERNAL;
  }
}

static const struct te_runtime_ops kCudaRuntime = {
    "CUDA",
    (int)cudaErrorNotReady,
    cuda_set_device,
    cuda_malloc_device,
    cuda_free_device,
    cuda_malloc_host,
    cuda_free_host,
    cuda_stream_create,
    cuda_stream_destroy,
    cuda_stream_query,
    cuda_stream_synchronize,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_event_query,
    cuda_event_synchronize,
    cuda_stream_wait_event,
    cuda_memcpy_async,
    cuda_error_string,
    cuda_status_of,
};

static void cuda_versions(int* driver, int* runtime) {
  cudaRuntimeGetVersion(runtime);
  cudaDriverGetVersion(driver); /* 0 when libcuda.so.1 is missing */
}

static int cuda_device_count(int* count) { return (int)cudaGetDeviceCount(count); }

static int32_t cuda_driver_failure(int driver, int runtime, int code, castmesh_error_v1* error) {
  if (driver == 0) {
    return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
                   "no CUDA driver (libcuda.so.1 not found; %s); install the NVIDIA driver to use GPUs",
                   cudaGetErrorString((cudaError_t)code));
  }
  return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
                 "the CUDA driver (version %d) cannot run CUDA runtime %d (%s); update the NVIDIA driver", driver,
                 runtime, cudaGetErrorString((cudaError_t)code));
}

static int cuda_describe_device(int index, castmesh_device_info_v1* out) {
  struct cudaDeviceProp prop;
  const cudaError_t status = cudaGetDeviceProperties(&prop, index);
  if (status != cudaSuccess) return (int)status;
  snprintf(out->name, sizeof out->name, "%.127s", prop.name);
  out->memory_bytes = (uint64_t)prop.totalGlobalMem;
  snprintf(out->detail, sizeof out->detail, "compute_capability=%d.%d multiprocessors=%d pci=%04x:%02x:%02x",
           prop.major, prop.minor, prop.multiProcessorCount, (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID,
           (unsigned)prop.pciDeviceID);
  return 0;
}

static const char* const kNcclLibraries[] = {TE_NCCL_LIBRARY, NULL};

static const struct te_vendor kCudaVendor = {
    .version = CASTMESH_BACKEND_VERSION "+cuda",
    .device_kind = CASTMESH_DEVICE_KIND_CUDA,
    .runtime = &kCudaRuntime,
    .load_collectives = te_nccl_dlopen,
    .collective_libraries = kNcclLibraries,
    .collective_hint = TE_NCCL_INSTALL_HINT,
    .versions = cuda_versions,
    .device_count = cuda_device_count,
    .device_count_call = "cudaGetDeviceCount",
    .no_device_code = (int)cudaErrorNoDevice,
    .driver_failure = cuda_driver_failure,
    .describe_device = cuda_describe_device,
    .describe_device_call = "cudaGetDeviceProperties",
};

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  return te_backend_init(&kCudaVendor, host);
}
