/* The tensor_engine plugin's vendor-neutral half (see te_backend.h): one
 * backend record and one engine per process, whatever the GPU vendor. */
#include "te_backend.h"

#include <stdio.h>

/* Bound once by te_backend_init (under the core's loader lock); g_device_count
 * is written by init and read by query_devices, which the core calls only
 * after init returned. */
static const struct te_vendor* g_vendor;
static const castmesh_host_api_v1* g_host;
static int g_device_count;
static struct te_engine g_engine;
static castmesh_backend_v1 g_record;

static int32_t backend_init(castmesh_error_v1* error) {
  const struct te_vendor* v = g_vendor;
  const char* vendor = v->runtime->vendor;
  int driver = 0;
  int runtime = 0;
  int code;
  v->versions(&driver, &runtime);
  g_device_count = 0;
  code = v->device_count(&g_device_count);
  if (code == v->no_device_code || (code == 0 && g_device_count <= 0)) {
    g_device_count = 0;
    return te_fail(error, CASTMESH_STATUS_NO_DEVICE, "no %s device (driver %d, runtime %d): %s%s", vendor, driver,
                   runtime, code == 0 ? v->device_count_call : v->runtime->error_string(code),
                   code == 0 ? " found 0 devices" : "");
  }
  if (code != 0) {
    g_device_count = 0;
    return v->driver_failure(driver, runtime, code, error);
  }
  if (g_host != NULL && g_host->log != NULL) {
    char line[96];
    snprintf(line, sizeof line, "%d %s device(s), driver %d, runtime %d", g_device_count, vendor, driver, runtime);
    g_host->log(CASTMESH_LOG_LEVEL_DEBUG, "tensor_engine", line);
  }
  return CASTMESH_STATUS_OK;
}

/* Nothing to release: the engine's handles belong to the caller, and the
 * runtimes register their own exit handlers. */
static void backend_shutdown(void) {}

static int32_t backend_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                                     castmesh_error_v1* error) {
  const struct te_vendor* v = g_vendor;
  int i;
  *count = 0;
  if (g_device_count == 0) return te_fail(error, CASTMESH_STATUS_NO_DEVICE, "no %s device", v->runtime->vendor);
  for (i = 0; i < g_device_count && (uint32_t)i < capacity; ++i) {
    castmesh_device_info_v1* out = &devices[i];
    int code;
    if (out->struct_size < sizeof(castmesh_device_info_v1)) break;
    code = v->describe_device(i, out);
    if (code != 0) {
      return te_fail(error, CASTMESH_STATUS_INTERNAL, "%s(%d): %s", v->describe_device_call, i,
                     v->runtime->error_string(code));
    }
    out->kind = v->device_kind;
    out->index = i;
  }
  *count = (uint32_t)g_device_count;
  return CASTMESH_STATUS_OK;
}

/* Plain-C trampolines from the table's signatures to the engine's. */
#define TE_WRAP(name, params, args) \
  static int32_t backend_##name params { return te_##name args; }
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
TE_WRAP(stream_wrap, (int32_t d, void* n, castmesh_te_stream_v1** s, castmesh_error_v1* x), (&g_engine, d, n, s, x))
static int32_t backend_stream_native(castmesh_te_stream_v1* s, void** n, castmesh_error_v1* x) {
  return te_stream_native_handle(&g_engine, s, n, x);
}

static const castmesh_tensor_engine_table_v1 kTensorEngine = {
    sizeof(castmesh_tensor_engine_table_v1),
    backend_device_alloc,
    backend_device_free,
    backend_pinned_alloc,
    backend_pinned_free,
    backend_stream_create,
    backend_stream_destroy,
    backend_stream_query,
    backend_stream_synchronize,
    backend_event_create,
    backend_event_destroy,
    backend_event_record,
    backend_event_query,
    backend_event_synchronize,
    backend_stream_wait_event,
    backend_copy,
    backend_comm_unique_id,
    backend_comm_create,
    backend_comm_destroy,
    backend_comm_abort,
    backend_comm_async_error,
    backend_allreduce,
    backend_broadcast,
    backend_allgather,
    backend_reduce_scatter,
    backend_send,
    backend_recv,
    backend_group_begin,
    backend_group_end,
    backend_stream_wrap,
    backend_stream_native,
};

const castmesh_backend_v1* te_backend_init(const struct te_vendor* vendor, const castmesh_host_api_v1* host) {
  if (vendor == NULL || host == NULL || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR) return NULL;
  if (g_vendor != NULL) {
    /* A second call keeps the engine and its loaded collective library. */
    if (g_vendor != vendor) return NULL;
    g_host = host;
    return &g_record;
  }
  g_vendor = vendor;
  g_host = host;
  g_engine.runtime = vendor->runtime;
  g_engine.load_nccl = vendor->load_collectives;
  g_engine.nccl_libraries = vendor->collective_libraries;
  g_engine.nccl_hint = vendor->collective_hint;
  te_engine_init(&g_engine);
  g_record.struct_size = sizeof(castmesh_backend_v1);
  g_record.abi_major = CASTMESH_BACKEND_ABI_MAJOR;
  g_record.abi_minor = CASTMESH_BACKEND_ABI_MINOR;
  g_record.name = "tensor_engine";
  g_record.version = vendor->version;
  g_record.init = &backend_init;
  g_record.shutdown = &backend_shutdown;
  g_record.query_devices = &backend_query_devices;
  g_record.rdma = NULL; /* rdma: the rdma backend's (ABI 1.1) */
  g_record.tensor_engine = &kTensorEngine;
  return &g_record;
}
