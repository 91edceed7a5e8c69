/* tensor_engine backend, CUDA build.
 *
 * Linked against the static CUDA runtime (libcudart_static.a), which finds the
 * driver (libcuda.so.1) with dlopen at run time: this library loads on any
 * machine, and a machine without driver or GPU gets NO_DRIVER / NO_DEVICE from
 * init with a message saying so.
 *
 * ABI 1.1: castmesh_tensor_engine_table_v1 (device memory, streams, events,
 * copies, NCCL collectives). This file binds the table to one engine over the
 * real CUDA runtime (te_cuda_real.c) and NCCL opened with dlopen at first
 * collective use (te_nccl_dlopen.c; never linked, never bundled). The logic
 * is in te_engine.c, which the unit tests run against fakes. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "castmesh/backend_abi.h"
#include "te_engine.h"
#include "te_ops.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

/* Set once by castmesh_backend_init_v1; device count set once by init. */
static const castmesh_host_api_v1* g_host;
static int g_device_count;


static int32_t cuda_init(castmesh_error_v1* error) {
  int runtime = 0;
  int driver = 0;
  cudaError_t status;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver); /* 0 when libcuda.so.1 is missing */
  status = cudaGetDeviceCount(&g_device_count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && g_device_count == 0)) {
    g_device_count = 0;
    return te_fail(error, CASTMESH_STATUS_NO_DEVICE, "no CUDA device (driver %d, runtime %d): %s", driver, runtime,
                status == cudaSuccess ? "cudaGetDeviceCount found 0 devices" : cudaGetErrorString(status));
  }
  if (status != cudaSuccess) {
    g_device_count = 0;
    if (driver == 0) {
      return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
                  "no CUDA driver (libcuda.so.1 not found; %s); install the NVIDIA driver to use GPUs",
                  cudaGetErrorString(status));
    }
    return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
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
  if (g_device_count == 0) return te_fail(error, CASTMESH_STATUS_NO_DEVICE, "no CUDA device");
  for (i = 0; i < g_device_count && (uint32_t)i < capacity; ++i) {
    struct cudaDeviceProp prop;
    castmesh_device_info_v1* out = &devices[i];
    cudaError_t status = cudaGetDeviceProperties(&prop, i);
    if (out->struct_size < sizeof(castmesh_device_info_v1)) break;
    if (status != cudaSuccess) {
      return te_fail(error, CASTMESH_STATUS_INTERNAL, "cudaGetDeviceProperties(%d): %s", i,
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

/* The one engine; initialised by castmesh_backend_init_v1. */
static struct te_engine g_engine;

/* Plain-C trampolines from the table's signatures to the engine's. */
#define TE_WRAP(name, params, args) \
  static int32_t cuda_##name params { return te_##name args; }
TE_WRAP(device_alloc, (int32_t d, uint64_t n, void** p, castmesh_error_v1* x), (&g_engine, d, n, p, x))
TE_WRAP(device_free, (void* p, castmesh_error_v1* x), (&g_engine, p, x))
TE_WRAP(pinned_alloc, (uint64_t n, void** p, castmesh_error_v1* x), (&g_engine, n, p, x))
TE_WRAP(pinned_free, (void* p, castmesh_error_v1* x), (&g_engine, p, x))
TE_WRAP(stream_create, (int32_t d, castmesh_te_stream_v1** s, castmesh_error_v1* x), (&g_engine, d, s, x))
TE_WRAP(stream_destroy, (castmesh_te_stream_v1* s, castmesh_error_v1* x), (&g_engine, s, x))
TE_WRAP(stream_query, (castmesh_te_stream_v1* s, int32_t* k, castmesh_error_v1* x), (&g_engine, s, k, x))
TE_WRAP(stream_synchronize, (castmesh_te_stream_v1* s, castmesh_error_v1* x), (&g_engine, s, x))
TE_WRAP(event_create, (int32_t d, castmesh_te_event_v1** v, castmesh_error_v1* x), (&g_engine, d, v, x))
TE_WRAP(event_destroy, (castmesh_te_event_v1* v, castmesh_error_v1* x), (&g_engine, v, x))
TE_WRAP(event_record, (castmesh_te_event_v1* v, castmesh_te_stream_v1* s, castmesh_error_v1* x),
        (&g_engine, v, s, x))
TE_WRAP(event_query, (castmesh_te_event_v1* v, int32_t* k, castmesh_error_v1* x), (&g_engine, v, k, x))
TE_WRAP(event_synchronize, (castmesh_te_event_v1* v, castmesh_error_v1* x), (&g_engine, v, x))
TE_WRAP(stream_wait_event, (castmesh_te_stream_v1* s, castmesh_te_event_v1* v, castmesh_error_v1* x),
        (&g_engine, s, v, x))
TE_WRAP(copy, (void* o, const void* i, uint64_t n, int32_t k, castmesh_te_stream_v1* s, castmesh_error_v1* x),
        (&g_engine, o, i, n, k, s, x))
TE_WRAP(comm_unique_id, (castmesh_te_unique_id_v1* u, castmesh_error_v1* x), (&g_engine, u, x))
TE_WRAP(comm_create,
        (int32_t d, const castmesh_te_unique_id_v1* u, int32_t n, int32_t r, castmesh_te_comm_v1** c,
         castmesh_error_v1* x),
        (&g_engine, d, u, n, r, c, x))
TE_WRAP(comm_destroy, (castmesh_te_comm_v1* c, castmesh_error_v1* x), (&g_engine, c, x))
TE_WRAP(comm_abort, (castmesh_te_comm_v1* c, castmesh_error_v1* x), (&g_engine, c, x))
TE_WRAP(comm_async_error, (castmesh_te_comm_v1* c, castmesh_error_v1* x), (&g_engine, c, x))
TE_WRAP(allreduce,
        (castmesh_te_comm_v1* c, const void* i, void* o, uint64_t n, int32_t t, int32_t r, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, i, o, n, t, r, s, x))
TE_WRAP(broadcast,
        (castmesh_te_comm_v1* c, const void* i, void* o, uint64_t n, int32_t t, int32_t r, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, i, o, n, t, r, s, x))
TE_WRAP(allgather,
        (castmesh_te_comm_v1* c, const void* i, void* o, uint64_t n, int32_t t, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, i, o, n, t, s, x))
TE_WRAP(reduce_scatter,
        (castmesh_te_comm_v1* c, const void* i, void* o, uint64_t n, int32_t t, int32_t r, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, i, o, n, t, r, s, x))
TE_WRAP(send,
        (castmesh_te_comm_v1* c, const void* b, uint64_t n, int32_t t, int32_t p, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, b, n, t, p, s, x))
TE_WRAP(recv,
        (castmesh_te_comm_v1* c, void* b, uint64_t n, int32_t t, int32_t p, castmesh_te_stream_v1* s,
         castmesh_error_v1* x),
        (&g_engine, c, b, n, t, p, s, x))
TE_WRAP(group_begin, (castmesh_error_v1* x), (&g_engine, x))
TE_WRAP(group_end, (castmesh_error_v1* x), (&g_engine, x))

static const castmesh_tensor_engine_table_v1 kCudaTensorEngine = {
    sizeof(castmesh_tensor_engine_table_v1),
    cuda_device_alloc,
    cuda_device_free,
    cuda_pinned_alloc,
    cuda_pinned_free,
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
    cuda_copy,
    cuda_comm_unique_id,
    cuda_comm_create,
    cuda_comm_destroy,
    cuda_comm_abort,
    cuda_comm_async_error,
    cuda_allreduce,
    cuda_broadcast,
    cuda_allgather,
    cuda_reduce_scatter,
    cuda_send,
    cuda_recv,
    cuda_group_begin,
    cuda_group_end,
};

static const castmesh_backend_v1 kCudaBackend = {
    sizeof(castmesh_backend_v1),
    CASTMESH_BACKEND_ABI_MAJOR,
    CASTMESH_BACKEND_ABI_MINOR,
    "tensor_engine",
    CASTMESH_BACKEND_VERSION "+cuda",
    &cuda_init,
    &cuda_shutdown,
    &cuda_query_devices,
    NULL, /* rdma: none (ABI 1.1) */
    &kCudaTensorEngine,
};

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  if (host == NULL || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR) return NULL;
  g_host = host;
  if (g_engine.runtime != NULL) return &kCudaBackend; /* a second call keeps the engine and its NCCL */
  g_engine.runtime = te_cuda_runtime();
  g_engine.load_nccl = te_nccl_dlopen;
  g_engine.nccl_library = TE_NCCL_LIBRARY;
  g_engine.nccl_hint = TE_NCCL_INSTALL_HINT;
  te_engine_init(&g_engine);
  return &kCudaBackend;
}
