// tensor_engine backend, HIP build (AMD GPUs through the ROCm/HIP runtime).
//
// Links libamdhip64; on a machine without the ROCm driver or a GPU, init
// reports NO_DRIVER / NO_DEVICE with a message saying so. Only C types cross
// the ABI; this file is C++ because the HIP headers are.
#include <hip/hip_runtime_api.h>

#include <cstdarg>
#include <cstdio>

#include "castmesh/backend_abi.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

namespace {

// Set once by castmesh_backend_init_v1; device count set once by init.
const castmesh_host_api_v1* g_host = nullptr;
int g_device_count = 0;

__attribute__((format(printf, 3, 4))) int32_t fail(castmesh_error_v1* error, int32_t code, const char* format,
                                                   ...) {
  if (error != nullptr) {
    error->code = code;
    va_list args;
    va_start(args, format);
    std::vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return code;
}

int32_t hip_init(castmesh_error_v1* error) {
  int runtime = 0;
  int driver = 0;
  (void)hipRuntimeGetVersion(&runtime);
  (void)hipDriverGetVersion(&driver);
  const hipError_t status = hipGetDeviceCount(&g_device_count);
  if (status == hipErrorNoDevice || (status == hipSuccess && g_device_count == 0)) {
    g_device_count = 0;
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "no HIP device (driver %d, runtime %d): %s", driver, runtime,
                status == hipSuccess ? "hipGetDeviceCount found 0 devices" : hipGetErrorString(status));
  }
  if (status != hipSuccess) {
    g_device_count = 0;
    return fail(error, CASTMESH_STATUS_NO_DRIVER,
                "no usable HIP driver (%s); install the ROCm kernel driver (amdgpu) and runtime",
                hipGetErrorString(status));
  }
  return CASTMESH_STATUS_OK;
}

void hip_shutdown() {}

int32_t hip_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                          castmesh_error_v1* error) {
  *count = 0;
  if (g_device_count == 0) return fail(error, CASTMESH_STATUS_NO_DEVICE, "no HIP device");
  for (int i = 0; i < g_device_count && static_cast<uint32_t>(i) < capacity; ++i) {
    castmesh_device_info_v1& out = devices[i];
    if (out.struct_size < sizeof(castmesh_device_info_v1)) break;
    hipDeviceProp_t prop{};
    const hipError_t status = hipGetDeviceProperties(&prop, i);
    if (status != hipSuccess) {
      return fail(error, CASTMESH_STATUS_INTERNAL, "hipGetDeviceProperties(%d): %s", i, hipGetErrorString(status));
    }
    out.kind = CASTMESH_DEVICE_KIND_HIP;
    out.index = i;
    std::snprintf(out.name, sizeof out.name, "%.127s", prop.name);
    out.memory_bytes = static_cast<uint64_t>(prop.totalGlobalMem);
    std::snprintf(out.detail, sizeof out.detail, "arch=%.64s compute_capability=%d.%d multiprocessors=%d",
                  prop.gcnArchName, prop.major, prop.minor, prop.multiProcessorCount);
  }
  *count = static_cast<uint32_t>(g_device_count);
  return CASTMESH_STATUS_OK;
}

const castmesh_backend_v1 kHipBackend = {
    sizeof(castmesh_backend_v1),
    CASTMESH_BACKEND_ABI_MAJOR,
    CASTMESH_BACKEND_ABI_MINOR,
    "tensor_engine",
    CASTMESH_BACKEND_VERSION "+hip",
    &hip_init,
    &hip_shutdown,
    &hip_query_devices,
    nullptr,  /* rdma: none (ABI 1.1) */
    // tensor_engine: not yet on HIP. te_engine.c is vendor-neutral; a HIP
    // te_runtime_ops (hipMalloc, hipStreamCreateWithFlags, ...) and RCCL
    // through te_nccl_dlopen("librccl.so") would plug in here.
    nullptr,
};

}  // namespace

extern "C" CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(
    const castmesh_host_api_v1* host) {
  if (host == nullptr || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR) return nullptr;
  g_host = host;
  return &kHipBackend;
}
