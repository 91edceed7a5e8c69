/* tensor_engine backend, CUDA build.
 *
 * Linked against the static CUDA runtime (libcudart_static.a), which finds the
 * driver (libcuda.so.1) with dlopen at run time: this library loads on any
 * machine, and a machine without driver or GPU gets NO_DRIVER / NO_DEVICE from
 * init with a message saying so. Device memory, streams, copies and NCCL
 * collectives are added to the table in later ABI minors. */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>

#include "castmesh/backend_abi.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

/* Set once by castmesh_backend_init_v1; device count set once by init. */
static const castmesh_host_api_v1* g_host;
static int g_device_count;

static int32_t fail(castmesh_error_v1* error, int32_t code, const char* format, ...) {
  va_list args;
  if (error != NULL) {
    error->code = code;
    va_start(args, format);
    vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return code;
}

static int32_t cuda_init(castmesh_error_v1* error) {
  int runtime = 0;
  int driver = 0;
  cudaError_t status;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver); /* 0 when libcuda.so.1 is missing */
  status = cudaGetDeviceCount(&g_device_count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && g_device_count == 0)) {
    g_device_count = 0;
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "no CUDA device (driver %d, runtime %d): %s", driver, runtime,
                status == cudaSuccess ? "cudaGetDeviceCount found 0 devices" : cudaGetErrorString(status));
  }
  if (status != cudaSuccess) {
    g_device_count = 0;
    if (driver == 0) {
      return fail(error, CASTMESH_STATUS_NO_DRIVER,
                  "no CUDA driver (libcuda.so.1 not found; %s); install the NVIDIA driver to use GPUs",
                  cudaGetErrorString(status));
    }
    return fail(error, CASTMESH_STATUS_NO_DRIVER,
                "the CUDA driver (version %d) cannot run CUDA runtime %d (%s); update the NVIDIA driver", driver,
                runtime, cudaGetErrorString(status));
  }
  if (g_host != NULL && g_host->log != NULL) {
    char line[96];
    snprintf(line, sizeof line, "%d CUDA device(s), driver %d, runtime %d", g_device_count, driver, runtime);
    g_host->log(CASTMESH_LOG_LEVEL_DEBUG, "tensor_engine", line);
  }
  return CASTMESH_STATUS_OK;
}

static void cuda_shutdown(void) {}

static int32_t cuda_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                                  castmesh_error_v1* error) {
  int i;
  *count = 0;
  if (g_device_count == 0) return fail(error, CASTMESH_STATUS_NO_DEVICE, "no CUDA device");
  for (i = 0; i < g_device_count && (uint32_t)i < capacity; ++i) {
    struct cudaDeviceProp prop;
    castmesh_device_info_v1* out = &devices[i];
    cudaError_t status = cudaGetDeviceProperties(&prop, i);
    if (out->struct_size < sizeof(castmesh_device_info_v1)) break;
    if (status != cudaSuccess) {
      return fail(error, CASTMESH_STATUS_INTERNAL, "cudaGetDeviceProperties(%d): %s", i,
                  cudaGetErrorString(status));
    }
    out->kind = CASTMESH_DEVICE_KIND_CUDA;
    out->index = i;
    snprintf(out->name, sizeof out->name, "%.127s", prop.name);
    out->memory_bytes = (uint64_t)prop.totalGlobalMem;
    snprintf(out->detail, sizeof out->detail, "compute_capability=%d.%d multiprocessors=%d pci=%04x:%02x:%02x",
             prop.major, prop.minor, prop.multiProcessorCount, (unsigned)prop.pciDomainID,
             (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
  }
  *count = (uint32_t)g_device_count;
  return CASTMESH_STATUS_OK;
}

static const castmesh_backend_v1 kCudaBackend = {
    sizeof(castmesh_backend_v1),
    CASTMESH_BACKEND_ABI_MAJOR,
    CASTMESH_BACKEND_ABI_MINOR,
    "tensor_engine",
    CASTMESH_BACKEND_VERSION "+cuda",
    &cuda_init,
    &cuda_shutdown,
    &cuda_query_devices,
    NULL,  /* rdma: none (ABI 1.1) */
};

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  if (host == NULL || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR) return NULL;
  g_host = host;
  return &kCudaBackend;
}
