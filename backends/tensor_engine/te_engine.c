/* tensor_engine logic (see te_engine.h). Handles are small heap records that
 * remember their device, because the runtime's current device is per host
 * thread and every call may come from a different thread. */
#include "te_engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tags that catch a handle of the wrong kind (not a freed one). */
enum { kStreamTag = 0x5354524du, kEventTag = 0x45564e54u, kCommTag = 0x434f4d4du };

struct castmesh_te_stream_v1 {
  uint32_t tag;
  int32_t device;
  int32_t owned; /* 0 for stream_wrap's handles: the native stream is the caller's */
  void* native;
};
struct castmesh_te_event_v1 {
  uint32_t tag;
  int32_t device;
  void* native;
};
struct castmesh_te_comm_v1 {
  uint32_t tag;
  int32_t device;
  int32_t nranks;
  int32_t rank;
  void* native;
};

int32_t te_fail(castmesh_error_v1* error, int32_t code, const char* format, ...) {
  va_list args;
  if (error != NULL) {
    error->code = code;
    va_start(args, format);
    vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return code;
}

/* A failed runtime call: its status, the vendor's text and what to do. */
static int32_t runtime_fail(struct te_engine* e, castmesh_error_v1* error, const char* call, int code) {
  const int32_t status = e->runtime->status_of(code);
  const char* hint = "check the device with nvidia-smi / rocm-smi";
  if (status == CASTMESH_STATUS_RESOURCE_EXHAUSTED) hint = "free device memory or use smaller buffers";
  if (status == CASTMESH_STATUS_NO_DEVICE) hint = "pass a device index that query_devices reported";
  if (status == CASTMESH_STATUS_INVALID_ARGUMENT) hint = "check the pointers, sizes and handles passed";
  return te_fail(error, status, "%s %s failed: %s (%d); %s", e->runtime->vendor, call, e->runtime->error_string(code),
              code, hint);
}

void te_engine_init(struct te_engine* engine) {
  pthread_mutex_init(&engine->mu, NULL);
  engine->nccl_state = 0;
  engine->nccl_why[0] = '\0';
  memset(&engine->nccl, 0, sizeof engine->nccl);
}

static int32_t use_device(struct te_engine* e, int32_t device, castmesh_error_v1* error) {
  int code;
  if (device < 0) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "device %d: device indices start at 0", device);
  code = e->runtime->set_device(device);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "set device", code);
}

#define TE_CHECK(handle, kind_tag, what)                                                                         \
  do {                                                                                                           \
    if ((handle) == NULL || (handle)->tag != (kind_tag)) {                                                       \
      return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,                                                       \
                  "unknown %s handle %p: pass one this backend's %s_create returned and did not destroy", what, \
                  (const void*)(handle), what);                                                                  \
    }                                                                                                            \
  } while (0)

int32_t te_device_alloc(struct te_engine* e, int32_t device, uint64_t bytes, void** ptr, castmesh_error_v1* error) {
  int32_t status;
  int code;
  if (ptr == NULL || bytes == 0) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "device_alloc needs bytes > 0 and a result pointer");
  }
  *ptr = NULL;
  status = use_device(e, device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  code = e->runtime->malloc_device(ptr, (size_t)bytes);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "device malloc", code);
}

int32_t te_device_free(struct te_engine* e, void* ptr, castmesh_error_v1* error) {
  int code;
  if (ptr == NULL) return CASTMESH_STATUS_OK;
  code = e->runtime->free_device(ptr);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "device free", code);
}

int32_t te_pinned_alloc(struct te_engine* e, uint64_t bytes, void** ptr, castmesh_error_v1* error) {
  int code;
  if (ptr == NULL || bytes == 0) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "pinned_alloc needs bytes > 0 and a result pointer");
  }
  *ptr = NULL;
  code = e->runtime->malloc_host(ptr, (size_t)bytes);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "pinned host malloc", code);
}

int32_t te_pinned_free(struct te_engine* e, void* ptr, castmesh_error_v1* error) {
  int code;
  if (ptr == NULL) return CASTMESH_STATUS_OK;
  code = e->runtime->free_host(ptr);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "pinned host free", code);
}

int32_t te_stream_create(struct te_engine* e, int32_t device, castmesh_te_stream_v1** stream,
                         castmesh_error_v1* error) {
  struct castmesh_te_stream_v1* made;
  int32_t status;
  int code;
  if (stream == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "stream_create needs a result pointer");
  *stream = NULL;
  status = use_device(e, device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  made = (struct castmesh_te_stream_v1*)calloc(1, sizeof *made);
  if (made == NULL) return te_fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of host memory for a stream");
  code = e->runtime->stream_create(&made->native);
  if (code != 0) {
    free(made);
    return runtime_fail(e, error, "stream create", code);
  }
  made->tag = kStreamTag;
  made->device = device;
  made->owned = 1;
  *stream = made;
  return CASTMESH_STATUS_OK;
}

int32_t te_stream_destroy(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  int code;
  TE_CHECK(stream, kStreamTag, "stream");
  code = stream->owned ? e->runtime->stream_destroy(stream->native) : 0;
  stream->tag = 0;
  free(stream);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "stream destroy", code);
}

/* A query's answer: done, pending, or the failure of the work. */
static int32_t query_result(struct te_engine* e, int code, int32_t* done, const char* call,
                            castmesh_error_v1* error) {
  if (done == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "%s needs a result pointer", call);
  *done = code == 0;
  if (code == 0 || code == e->runtime->not_ready) return CASTMESH_STATUS_OK;
  return runtime_fail(e, error, call, code);
}

int32_t te_stream_query(struct te_engine* e, castmesh_te_stream_v1* stream, int32_t* done, castmesh_error_v1* error) {
  TE_CHECK(stream, kStreamTag, "stream");
  return query_result(e, e->runtime->stream_query(stream->native), done, "stream query", error);
}

int32_t te_stream_synchronize(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  int code;
  TE_CHECK(stream, kStreamTag, "stream");
  code = e->runtime->stream_synchronize(stream->native);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "stream synchronize", code);
}

int32_t te_event_create(struct te_engine* e, int32_t device, castmesh_te_event_v1** event, castmesh_error_v1* error) {
  struct castmesh_te_event_v1* made;
  int32_t status;
  int code;
  if (event == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "event_create needs a result pointer");
  *event = NULL;
  status = use_device(e, device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  made = (struct castmesh_te_event_v1*)calloc(1, sizeof *made);
  if (made == NULL) return te_fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of host memory for an event");
  code = e->runtime->event_create(&made->native);
  if (code != 0) {
    free(made);
    return runtime_fail(e, error, "event create", code);
  }
  made->tag = kEventTag;
  made->device = device;
  *event = made;
  return CASTMESH_STATUS_OK;
}

int32_t te_event_destroy(struct te_engine* e, castmesh_te_event_v1* event, castmesh_error_v1* error) {
  int code;
  TE_CHECK(event, kEventTag, "event");
  code = e->runtime->event_destroy(event->native);
  event->tag = 0;
  free(event);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "event destroy", code);
}

int32_t te_event_record(struct te_engine* e, castmesh_te_event_v1* event, castmesh_te_stream_v1* stream,
                        castmesh_error_v1* error) {
  int code;
  TE_CHECK(event, kEventTag, "event");
  TE_CHECK(stream, kStreamTag, "stream");
  if (event->device != stream->device) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "event of device %d recorded on a stream of device %d: create the event on the stream's device",
                event->device, stream->device);
  }
  code = e->runtime->event_record(event->native, stream->native);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "event record", code);
}

int32_t te_event_query(struct te_engine* e, castmesh_te_event_v1* event, int32_t* done, castmesh_error_v1* error) {
  TE_CHECK(event, kEventTag, "event");
  return query_result(e, e->runtime->event_query(event->native), done, "event query", error);
}

int32_t te_event_synchronize(struct te_engine* e, castmesh_te_event_v1* event, castmesh_error_v1* error) {
  int code;
  TE_CHECK(event, kEventTag, "event");
  code = e->runtime->event_synchronize(event->native);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "event synchronize", code);
}

int32_t te_stream_wait_event(struct te_engine* e, castmesh_te_stream_v1* stream, castmesh_te_event_v1* event,
                             castmesh_error_v1* error) {
  int code;
  TE_CHECK(stream, kStreamTag, "stream");
  TE_CHECK(event, kEventTag, "event");
  code = e->runtime->stream_wait_event(stream->native, event->native);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "stream wait event", code);
}

int32_t te_copy(struct te_engine* e, void* dst, const void* src, uint64_t bytes, int32_t kind,
                castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  int32_t status;
  int code;
  TE_CHECK(stream, kStreamTag, "stream");
  if (kind < CASTMESH_TE_COPY_HOST_TO_DEVICE || kind > CASTMESH_TE_COPY_DEVICE_TO_DEVICE) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "copy kind %d: use CASTMESH_TE_COPY_HOST_TO_DEVICE, _DEVICE_TO_HOST or _DEVICE_TO_DEVICE", kind);
  }
  if (bytes == 0) return CASTMESH_STATUS_OK;
  if (dst == NULL || src == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "copy of %llu bytes with a NULL pointer", (unsigned long long)bytes);
  status = use_device(e, stream->device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  code = e->runtime->memcpy_async(dst, src, (size_t)bytes, kind, stream->native);
  return code == 0 ? CASTMESH_STATUS_OK : runtime_fail(e, error, "async memcpy", code);
}

/* ---- collectives ---- */

/* Tries each of the engine's collective library names in order; 0 when one
 * loaded, else -1 with every name's failure in nccl_why. Under e->mu. */
static int load_collectives(struct te_engine* e) {
  const char* const* name;
  size_t used = 0;
  e->nccl_why[0] = '\0';
  for (name = e->nccl_libraries; name != NULL && *name != NULL; ++name) {
    char why[256];
    why[0] = '\0';
    if (e->load_nccl(*name, &e->nccl, why, sizeof why) == 0) return 0;
    if (used < sizeof e->nccl_why) {
      const int wrote = snprintf(e->nccl_why + used, sizeof e->nccl_why - used, "%s%s", used > 0 ? "; " : "", why);
      used += wrote > 0 ? (size_t)wrote : 0;
    }
  }
  if (used == 0) snprintf(e->nccl_why, sizeof e->nccl_why, "no collective library name configured");
  return -1;
}

/* The collective library, loaded at first use; NO_DRIVER saying how to
 * install it when it is missing (remembered: dlopen is not retried). */
static int32_t nccl(struct te_engine* e, const struct te_nccl_ops** ops, castmesh_error_v1* error) {
  int state;
  pthread_mutex_lock(&e->mu);
  if (e->nccl_state == 0) e->nccl_state = load_collectives(e) == 0 ? 1 : -1;
  state = e->nccl_state;
  pthread_mutex_unlock(&e->mu);
  if (state < 0) {
    return te_fail(error, CASTMESH_STATUS_NO_DRIVER,
                   "device collectives need %s (not loaded: %s); memory, streams and copies still work", e->nccl_hint,
                   e->nccl_why);
  }
  *ops = &e->nccl;
  return CASTMESH_STATUS_OK;
}

static int32_t nccl_fail(const struct te_nccl_ops* ops, castmesh_error_v1* error, const char* call, int result,
                         void* comm) {
  int32_t status = CASTMESH_STATUS_INTERNAL;
  const char* hint = "see NCCL_DEBUG=WARN output";
  const char* last = ops->get_last_error != NULL ? ops->get_last_error(comm) : "";
  switch (result) {
    case TE_NCCL_INVALID_ARGUMENT:
      status = CASTMESH_STATUS_INVALID_ARGUMENT;
      hint = "check counts, dtypes, ranks and buffers";
      break;
    case TE_NCCL_INVALID_USAGE:
      status = CASTMESH_STATUS_FAILED_PRECONDITION;
      hint = "every rank must call the same collectives in the same order";
      break;
    case TE_NCCL_SYSTEM_ERROR:
    case TE_NCCL_REMOTE_ERROR:
      status = CASTMESH_STATUS_UNAVAILABLE;
      hint = "a peer or the network failed: abort the communicator and create a new one";
      break;
    default:
      break;
  }
  return te_fail(error, status, "%s failed: %s%s%s; %s", call, ops->get_error_string(result),
              last != NULL && last[0] != '\0' ? ": " : "", last != NULL ? last : "", hint);
}

static int32_t check_dtype_op(int32_t dtype, int32_t op, castmesh_error_v1* error) {
  if (dtype < CASTMESH_TE_DTYPE_INT8 || dtype > CASTMESH_TE_DTYPE_BFLOAT16) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "dtype %d is not a castmesh_te_dtype_v1", dtype);
  }
  if (op < CASTMESH_TE_REDUCE_SUM || op > CASTMESH_TE_REDUCE_AVG) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "reduce op %d is not a castmesh_te_reduce_op_v1 (user-defined reductions: stage to host)", op);
  }
  return CASTMESH_STATUS_OK;
}

/* Validates a collective call and selects its device; fills *ops. */
static int32_t collective_prologue(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_te_stream_v1* stream,
                                   const struct te_nccl_ops** ops, castmesh_error_v1* error) {
  int32_t status;
  TE_CHECK(comm, kCommTag, "comm");
  TE_CHECK(stream, kStreamTag, "stream");
  if (comm->device != stream->device) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "communicator of device %d used with a stream of device %d: use a stream of the communicator's device",
                comm->device, stream->device);
  }
  status = nccl(e, ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return use_device(e, comm->device, error);
}

int32_t te_comm_unique_id(struct te_engine* e, castmesh_te_unique_id_v1* id, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = nccl(e, &ops, error);
  int result;
  if (status != CASTMESH_STATUS_OK) return status;
  if (id == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "comm_unique_id needs a result pointer");
  result = ops->get_unique_id(id->bytes);
  return result == 0 ? CASTMESH_STATUS_OK : nccl_fail(ops, error, "ncclGetUniqueId", result, NULL);
}

int32_t te_comm_create(struct te_engine* e, int32_t device, const castmesh_te_unique_id_v1* id, int32_t nranks,
                       int32_t rank, castmesh_te_comm_v1** comm, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  struct castmesh_te_comm_v1* made;
  int32_t status;
  int result;
  if (comm == NULL || id == NULL) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "comm_create needs a unique id and a result pointer");
  }
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "rank %d of %d: need 0 <= rank < nranks", rank, nranks);
  }
  status = nccl(e, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  status = use_device(e, device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  made = (struct castmesh_te_comm_v1*)calloc(1, sizeof *made);
  if (made == NULL) return te_fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of host memory for a communicator");
  result = ops->comm_init_rank(&made->native, nranks, id->bytes, rank);
  if (result != 0) {
    free(made);
    return nccl_fail(ops, error, "ncclCommInitRank", result, NULL);
  }
  made->tag = kCommTag;
  made->device = device;
  made->nranks = nranks;
  made->rank = rank;
  *comm = made;
  return CASTMESH_STATUS_OK;
}

/* Ends a communicator with ncclCommDestroy or ncclCommAbort. */
static int32_t comm_end(struct te_engine* e, castmesh_te_comm_v1* comm, int abort, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status;
  int result;
  TE_CHECK(comm, kCommTag, "comm");
  status = nccl(e, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  result = abort ? ops->comm_abort(comm->native) : ops->comm_destroy(comm->native);
  comm->tag = 0;
  free(comm);
  return result == 0 ? CASTMESH_STATUS_OK
                     : nccl_fail(ops, error, abort ? "ncclCommAbort" : "ncclCommDestroy", result, NULL);
}

int32_t te_comm_destroy(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error) {
  return comm_end(e, comm, 0, error);
}

int32_t te_comm_abort(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error) {
  return comm_end(e, comm, 1, error);
}

int32_t te_comm_async_error(struct te_engine* e, castmesh_te_comm_v1* comm, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status;
  int async_error = 0;
  int result;
  TE_CHECK(comm, kCommTag, "comm");
  status = nccl(e, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  result = ops->comm_get_async_error(comm->native, &async_error);
  if (result != 0) return nccl_fail(ops, error, "ncclCommGetAsyncError", result, comm->native);
  if (async_error == 0 || async_error == TE_NCCL_IN_PROGRESS) return CASTMESH_STATUS_OK;
  return nccl_fail(ops, error, "device work of the communicator", async_error, comm->native);
}

#define TE_COLLECTIVE_RESULT(call, result) \
  ((result) == 0 ? CASTMESH_STATUS_OK : nccl_fail(ops, error, call, result, comm->native))

int32_t te_allreduce(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count,
                     int32_t dtype, int32_t op, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  status = check_dtype_op(dtype, op, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return TE_COLLECTIVE_RESULT("ncclAllReduce",
                              ops->all_reduce(send, recv, (size_t)count, dtype, op, comm->native, stream->native));
}

int32_t te_broadcast(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count,
                     int32_t dtype, int32_t root, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  status = check_dtype_op(dtype, CASTMESH_TE_REDUCE_SUM, error);
  if (status != CASTMESH_STATUS_OK) return status;
  if (root < 0 || root >= comm->nranks) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "broadcast root %d of %d ranks", root, comm->nranks);
  }
  return TE_COLLECTIVE_RESULT("ncclBroadcast",
                              ops->broadcast(send, recv, (size_t)count, dtype, root, comm->native, stream->native));
}

int32_t te_allgather(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv,
                     uint64_t send_count, int32_t dtype, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  status = check_dtype_op(dtype, CASTMESH_TE_REDUCE_SUM, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return TE_COLLECTIVE_RESULT("ncclAllGather",
                              ops->all_gather(send, recv, (size_t)send_count, dtype, comm->native, stream->native));
}

int32_t te_reduce_scatter(struct te_engine* e, castmesh_te_comm_v1* comm, const void* send, void* recv,
                          uint64_t recv_count, int32_t dtype, int32_t op, castmesh_te_stream_v1* stream,
                          castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status != CASTMESH_STATUS_OK) return status;
  status = check_dtype_op(dtype, op, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return TE_COLLECTIVE_RESULT(
      "ncclReduceScatter", ops->reduce_scatter(send, recv, (size_t)recv_count, dtype, op, comm->native, stream->native));
}

static int32_t check_peer(castmesh_te_comm_v1* comm, int32_t peer, castmesh_error_v1* error) {
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
    return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "peer %d: rank %d of %d needs another rank in [0, %d)",
                peer, comm->rank, comm->nranks, comm->nranks);
  }
  return CASTMESH_STATUS_OK;
}

int32_t te_send(struct te_engine* e, castmesh_te_comm_v1* comm, const void* buf, uint64_t count, int32_t dtype,
                int32_t peer, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status == CASTMESH_STATUS_OK) status = check_dtype_op(dtype, CASTMESH_TE_REDUCE_SUM, error);
  if (status == CASTMESH_STATUS_OK) status = check_peer(comm, peer, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return TE_COLLECTIVE_RESULT("ncclSend", ops->send(buf, (size_t)count, dtype, peer, comm->native, stream->native));
}

int32_t te_recv(struct te_engine* e, castmesh_te_comm_v1* comm, void* buf, uint64_t count, int32_t dtype,
                int32_t peer, castmesh_te_stream_v1* stream, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = collective_prologue(e, comm, stream, &ops, error);
  if (status == CASTMESH_STATUS_OK) status = check_dtype_op(dtype, CASTMESH_TE_REDUCE_SUM, error);
  if (status == CASTMESH_STATUS_OK) status = check_peer(comm, peer, error);
  if (status != CASTMESH_STATUS_OK) return status;
  return TE_COLLECTIVE_RESULT("ncclRecv", ops->recv(buf, (size_t)count, dtype, peer, comm->native, stream->native));
}

int32_t te_group_begin(struct te_engine* e, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = nccl(e, &ops, error);
  int result;
  if (status != CASTMESH_STATUS_OK) return status;
  result = ops->group_start();
  return result == 0 ? CASTMESH_STATUS_OK : nccl_fail(ops, error, "ncclGroupStart", result, NULL);
}

int32_t te_group_end(struct te_engine* e, castmesh_error_v1* error) {
  const struct te_nccl_ops* ops = NULL;
  int32_t status = nccl(e, &ops, error);
  int result;
  if (status != CASTMESH_STATUS_OK) return status;
  result = ops->group_end();
  return result == 0 ? CASTMESH_STATUS_OK : nccl_fail(ops, error, "ncclGroupEnd", result, NULL);
}

void* te_stream_native(const castmesh_te_stream_v1* stream) {
  return stream != NULL && stream->tag == kStreamTag ? stream->native : NULL;
}

int32_t te_stream_wrap(struct te_engine* e, int32_t device, void* native, castmesh_te_stream_v1** stream,
                       castmesh_error_v1* error) {
  struct castmesh_te_stream_v1* made;
  int32_t status;
  if (stream == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "stream_wrap needs a result pointer");
  *stream = NULL;
  status = use_device(e, device, error);
  if (status != CASTMESH_STATUS_OK) return status;
  made = (struct castmesh_te_stream_v1*)calloc(1, sizeof *made);
  if (made == NULL) return te_fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of host memory for a stream");
  made->tag = kStreamTag;
  made->device = device;
  made->owned = 0;
  made->native = native;
  *stream = made;
  return CASTMESH_STATUS_OK;
}

int32_t te_stream_native_handle(struct te_engine* e, castmesh_te_stream_v1* stream, void** native,
                                castmesh_error_v1* error) {
  (void)e;
  TE_CHECK(stream, kStreamTag, "stream");
  if (native == NULL) return te_fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "stream_native needs a result pointer");
  *native = stream->native;
  return CASTMESH_STATUS_OK;
}
