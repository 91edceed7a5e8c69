/* The tensor_engine backend's logic: castmesh_tensor_engine_table_v1 over a
 * device runtime and a collective library reached through te_ops.h tables.
 * The plugin binds one engine (te_backend.c) to the real CUDA or HIP runtime
 * and NCCL or RCCL opened with dlopen; the unit tests bind engines to fakes.
 * Every function is thread-safe and follows the contract in
 * castmesh/backend_abi.h. */
#ifndef CASTMESH_BACKENDS_TENSOR_ENGINE_TE_ENGINE_H_
#define CASTMESH_BACKENDS_TENSOR_ENGINE_TE_ENGINE_H_

#include <pthread.h>

#include "castmesh/backend_abi.h"
#include "te_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The collective libraries' file names, and what the NO_DRIVER message of a
 * missing one tells the user to install. RCCL has NCCL's API and symbols;
 * ROCm installs librccl.so.1, some distributions only the librccl.so link. */
#define TE_NCCL_LIBRARY "libnccl.so.2"
#define TE_NCCL_INSTALL_HINT "NCCL: pip install nvidia-nccl-cu13 (or -cu12)"
#define TE_RCCL_LIBRARY "librccl.so.1"
#define TE_RCCL_LIBRARY_LINK "librccl.so"
#define TE_RCCL_INSTALL_HINT "RCCL: install ROCm's rccl package (librccl1 on Debian 13 / Ubuntu 24.04)"

/* Loads the collective library into *ops; 0 or -1 with `why` filled. */
typedef int (*te_nccl_loader)(const char* library, struct te_nccl_ops* ops, char* why, size_t why_size);

/* One engine. Fill the first four fields, then call te_engine_init. */
struct te_engine {
  const struct te_runtime_ops* runtime;
  te_nccl_loader load_nccl; /* te_nccl_dlopen in the plugin */
  /* Collective library file names tried in order, NULL-terminated
   * ({"libnccl.so.2", NULL}; {"librccl.so.1", "librccl.so", NULL}). */
  const char* const* nccl_libraries;
  const char* nccl_hint; /* "<library>: <how to install it>", for the NO_DRIVER message */
  /* Lazily loaded collective library, under mu. */
  pthread_mutex_t mu;
  int nccl_state; /* 0 not tried, 1 loaded, -1 failed (why in nccl_why) */
  struct te_nccl_ops nccl;
  char nccl_why[400]; /* each tried library's failure, "; "-separated */
};

/* Fills *error (when not NULL) with `code` and the formatted message; returns
 * `code`. The one error writer of the tensor_engine backend's C sources. */
int32_t te_fail(castmesh_error_v1* error, int32_t code, const char* format, ...) __attribute__((format(printf, 3, 4)));

void te_engine_init(struct te_engine* engine);

int32_t te_device_alloc(struct te_engine* e, int32_t device, uint64_t bytes, void** ptr, castmesh_error_v1* error);
int32_t te_device_free(struct te_engine* e, void* ptr, castmesh_error_v1* error);
int32_t te_pinned_alloc(struct te_engine* e, uint64_t bytes, void** ptr, castmesh_error_v1* error);
int32_t te_pinned_free(struct te_engine* e, void* ptr, castmesh_error_v1* error);
int32_t te_stream_create(struct te_engine* e, int32_t device, castmesh_te_stream_v1** stream,
                         castmesh_error_v1* error);
int32_t te_stream_destroy(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_stream_query(struct te_engine* e, castmesh_te_stream_v1* stream, int32_t* done, castmesh_error_v1* error);
int32_t te_stream_synchronize(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_event_create(struct te_engine* e, int32_t device, castmesh_te_event_v1** event, castmesh_error_v1* error);
int32_t te_event_destroy(struct te_engine* e, castmesh_te_event_v1* event, castmesh_error_v1* error);
int32_t te_event_record(struct te_engine* e, castmesh_te_event_v1* event, castmesh_te_stream_v1* stream,
                        castmesh_error_v1* error);
int32_t te_event_query(struct te_engine* e, castmesh_te_event_v1* event, int32_t* done, castmesh_error_v1* error);
int32_t te_event_synchronize(struct te_engine* e, castmesh_te_event_v1* event, castmesh_error_v1* error);
int32_t te_stream_wait_event(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_te_event_v1* event,
                             castmesh_error_v1* error);
int32_t te_copy(struct te_engine* e, void* dst, const void* src, uint64_t bytes, int32_t kind,
                castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_comm_unique_id(struct te_engine* e, castmesh_te_unique_id_v1* id, castmesh_error_v1* error);
int32_t te_comm_create(struct te_engine* e, int32_t device, const castmesh_te_unique_id_v1* id, int32_t nranks,
                       int32_t rank, castmesh_te_comm_v1** comm, castmesh_error_v1* error);
int32_t te_comm_destroy(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error);
int32_t te_comm_abort(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error);
int32_t te_comm_async_error(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error);
int32_t te_allreduce(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count,
                     int32_t dtype, int32_t op, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_broadcast(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count,
                     int32_t dtype, int32_t root, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_allgather(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv,
                     uint64_t send_count, int32_t dtype, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_reduce_scatter(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv,
                          uint64_t recv_count, int32_t dtype, int32_t op, castmesh_te_stream_v1* stream,
                          castmesh_error_v1* error);
int32_t te_send(struct te_engine* e, castmesh_te_comm_v1* comm, const void* buf, uint64_t count, int32_t dtype,
                int32_t peer, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_recv(struct te_engine* e, castmesh_te_comm_v1* comm, void* buf, uint64_t count, int32_t dtype,
                int32_t peer, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
int32_t te_group_begin(struct te_engine* e, castmesh_error_v1* error);
/* castmesh_tensor_engine_table_v1.stream_wrap / .stream_native. */
int32_t te_stream_wrap(struct te_engine* e, int32_t device, void* native, castmesh_te_stream_v1** stream,
                       castmesh_error_v1* error);
int32_t te_stream_native_handle(struct te_engine* e, castmesh_te_stream_v1* stream, void** native,
                                castmesh_error_v1* error);
/* The runtime's own stream behind `stream` (cudaStream_t / hipStream_t), or
 * NULL for a handle that is not a live stream; for test fakes that enqueue
 * kernel-like work on it. */
void* te_stream_native(const castmesh_te_stream_v1* stream);
int32_t te_group_end(struct te_engine* e, castmesh_error_v1* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKENDS_TENSOR_ENGINE_TE_ENGINE_H_ */
