/* The tensor_engine plugin's vendor-neutral half (te_backend.c): the
 * castmesh_backend_v1 record, init / shutdown / query_devices and the ABI 1.1
 * castmesh_tensor_engine_table_v1 bound to one te_engine. A vendor (CUDA in
 * te_cuda_real.c, HIP in te_hip_real.cc) supplies only a struct te_vendor:
 * its runtime table, where its collective library lives, and how to probe and
 * describe its devices; its castmesh_backend_init_v1 calls te_backend_init. */
#ifndef CASTMESH_BACKENDS_TENSOR_ENGINE_TE_BACKEND_H_
#define CASTMESH_BACKENDS_TENSOR_ENGINE_TE_BACKEND_H_

#include "castmesh/backend_abi.h"
#include "te_engine.h"
#include "te_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One GPU vendor's binding. Static, immutable, process-wide. */
struct te_vendor {
  const char* version; /* CASTMESH_BACKEND_VERSION "+cuda" / "+hip": tells builds apart */
  int32_t device_kind; /* CASTMESH_DEVICE_KIND_CUDA / _HIP */
  const struct te_runtime_ops* runtime; /* runtime->vendor ("CUDA", "HIP") names it in messages */
  te_nccl_loader load_collectives;      /* te_nccl_dlopen in the plugins */
  /* Names tried in order at the first collective (NULL-terminated), and what
   * the NO_DRIVER message tells the user to install when none loads. */
  const char* const* collective_libraries;
  const char* collective_hint;
  /* Runtime and driver versions, for messages and the log (0: unknown). */
  void (*versions)(int* driver, int* runtime);
  /* <vendor>GetDeviceCount: a runtime code (0 success), *count on success. */
  int (*device_count)(int* count);
  const char* device_count_call; /* "cudaGetDeviceCount", for messages */
  int no_device_code;            /* what device_count returns without devices */
  /* Fills *error (NO_DRIVER) for another device_count failure `code`: the
   * driver missing or too old, and what to install. Returns the status. */
  int32_t (*driver_failure)(int driver, int runtime, int code, castmesh_error_v1* error);
  /* Fills name, memory_bytes and detail of device `index`; a runtime code. */
  int (*describe_device)(int index, castmesh_device_info_v1* out);
  const char* describe_device_call; /* "cudaGetDeviceProperties", for messages */
};

/* The backend record bound to `vendor`, for the vendor's
 * castmesh_backend_init_v1. NULL for a host of another ABI major. The first
 * call binds the process's one engine; later calls with the same vendor return
 * the same record and keep the engine (and its loaded collective library);
 * another vendor gets NULL. Called by the core under its loader lock. */
const castmesh_backend_v1* te_backend_init(const struct te_vendor* vendor, const castmesh_host_api_v1* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKENDS_TENSOR_ENGINE_TE_BACKEND_H_ */
