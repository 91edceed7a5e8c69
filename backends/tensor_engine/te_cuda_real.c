/* te_runtime_ops filled with the CUDA runtime (linked statically by the
 * plugin). Each entry converts handles from void* to the runtime's types. */
#include <cuda_runtime_api.h>

#include "castmesh/backend_abi.h"
#include "te_ops.h"

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

const struct te_runtime_ops* te_cuda_runtime(void) { return &kCudaRuntime; }
