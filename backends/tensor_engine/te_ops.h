/* The device runtime (CUDA or HIP) and collective library (NCCL or RCCL)
 * calls the tensor_engine backend makes, as tables of function pointers, so
 * the backend's logic (te_engine.c) runs against the real libraries in the
 * plugin and against fakes in the unit tests (tests/backends/tensor_engine)
 * on machines without a GPU. Vendor types cross as void*; codes are the
 * vendor's own (cudaError_t or hipError_t, ncclResult_t, which RCCL shares),
 * 0 meaning success. */
#ifndef CASTMESH_BACKENDS_TENSOR_ENGINE_TE_OPS_H_
#define CASTMESH_BACKENDS_TENSOR_ENGINE_TE_OPS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Device runtime. Each entry has the contract of the runtime function it is
 * named after (cudaSetDevice / hipSetDevice, ..., cudaMemcpyAsync /
 * hipMemcpyAsync); te_cuda_real.c and te_hip_real.cc fill it. */
struct te_runtime_ops {
  const char* vendor;  /* "CUDA" or "HIP", for messages */
  int not_ready;       /* the code query functions return for pending work */
  int (*set_device)(int device);
  int (*malloc_device)(void** ptr, size_t bytes);
  int (*free_device)(void* ptr);
  int (*malloc_host)(void** ptr, size_t bytes);
  int (*free_host)(void* ptr);
  int (*stream_create)(void** stream); /* non-blocking with the legacy default stream */
  int (*stream_destroy)(void* stream);
  int (*stream_query)(void* stream);
  int (*stream_synchronize)(void* stream);
  int (*event_create)(void** event); /* timing disabled */
  int (*event_destroy)(void* event);
  int (*event_record)(void* event, void* stream);
  int (*event_query)(void* event);
  int (*event_synchronize)(void* event);
  int (*stream_wait_event)(void* stream, void* event);
  /* kind: a castmesh_te_copy_kind_v1 */
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind, void* stream);
  const char* (*error_string)(int code);
  /* The castmesh_status_v1 a failure code means (out of memory, no device...). */
  int32_t (*status_of)(int code);
};

/* NCCL's (and RCCL's) public values the engine passes through; stable since
 * NCCL 2.0 (the castmesh_te_dtype_v1 / _reduce_op_v1 values equal them). */
enum {
  TE_NCCL_SUCCESS = 0,
  TE_NCCL_UNHANDLED_CUDA_ERROR = 1,
  TE_NCCL_SYSTEM_ERROR = 2,
  TE_NCCL_INTERNAL_ERROR = 3,
  TE_NCCL_INVALID_ARGUMENT = 4,
  TE_NCCL_INVALID_USAGE = 5,
  TE_NCCL_REMOTE_ERROR = 6,
  TE_NCCL_IN_PROGRESS = 7
};

/* Collective library. Each entry has the contract of the nccl function it is
 * named after; unique ids are the 128 bytes of ncclUniqueId. */
struct te_nccl_ops {
  int (*get_version)(int* version);
  int (*get_unique_id)(void* id);
  int (*comm_init_rank)(void** comm, int nranks, const void* id, int rank);
  int (*comm_destroy)(void* comm);
  int (*comm_abort)(void* comm);
  int (*comm_get_async_error)(void* comm, int* async_error);
  int (*all_reduce)(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream);
  int (*broadcast)(const void* send, void* recv, size_t count, int dtype, int root, void* comm, void* stream);
  int (*all_gather)(const void* send, void* recv, size_t send_count, int dtype, void* comm, void* stream);
  int (*reduce_scatter)(const void* send, void* recv, size_t recv_count, int dtype, int op, void* comm,
                        void* stream);
  int (*send)(const void* buf, size_t count, int dtype, int peer, void* comm, void* stream);
  int (*recv)(void* buf, size_t count, int dtype, int peer, void* comm, void* stream);
  int (*group_start)(void);
  int (*group_end)(void);
  const char* (*get_error_string)(int result);
  const char* (*get_last_error)(void* comm); /* may be NULL (older libraries) */
};

/* Opens the collective library `library` ("libnccl.so.2", "librccl.so.1")
 * with dlopen and fills *ops with its symbols (te_nccl_dlopen.c). Returns 0,
 * or -1 with `why` naming the library and what failed (dlerror's text, or the
 * missing symbol). The library is never closed. */
int te_nccl_dlopen(const char* library, struct te_nccl_ops* ops, char* why, size_t why_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKENDS_TENSOR_ENGINE_TE_OPS_H_ */
