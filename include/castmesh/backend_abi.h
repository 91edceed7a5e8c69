/* castmesh backend plugin ABI, version 1 (plain C; docs/plugins.md).
 *
 * A backend is a shared library that exports exactly one symbol,
 * castmesh_backend_init_v1. The core dlopen()s it (RTLD_NOW | RTLD_LOCAL),
 * calls that symbol once with a host API table and gets back a backend table.
 * Nothing but the plain C types below crosses this boundary: no C++ types, no
 * exceptions, no memory freed on the other side than it was allocated.
 *
 * Compatibility rules (the PJRT pattern):
 *   - the core accepts a backend whose abi_major equals its own and whose
 *     abi_minor is at or above the core's floor;
 *   - every table starts with struct_size; a reader only touches fields that
 *     lie inside the struct_size the writer declared. New fields are only ever
 *     appended (and bump abi_minor).
 *
 * Who calls what, on which thread: the core calls castmesh_backend_init_v1,
 * init and shutdown at most once each, under its own lock. query_devices may be called
 * from any thread at any time between init and shutdown; backends must make it
 * thread-safe. The host API functions may be called by the backend from any
 * thread between castmesh_backend_init_v1 and the return of shutdown.
 *
 * History: 1.0 init/shutdown/query_devices. 1.1 appends castmesh_backend_v1.rdma
 * (one-sided RDMA through the rdma backend), status codes 6..10 and
 * castmesh_backend_v1.tensor_engine (device memory, streams, collectives);
 * later 1.1 builds append stream_wrap/stream_native to that table (a plugin
 * whose table ends at group_end still loads; see the table's struct_size).
 */
#ifndef CASTMESH_BACKEND_ABI_H_
#define CASTMESH_BACKEND_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CASTMESH_BACKEND_ABI_MAJOR 1
#define CASTMESH_BACKEND_ABI_MINOR 1

/* The one symbol a backend library exports. */
#define CASTMESH_BACKEND_ENTRY_SYMBOL "castmesh_backend_init_v1"

/* Result of a backend call. Values are stable across ABI versions. */
typedef enum castmesh_status_v1 {
  CASTMESH_STATUS_OK = 0,
  /* The driver or system library the backend needs at run time is missing
   * (libcuda.so.1, the RDMA kernel modules, ...). */
  CASTMESH_STATUS_NO_DRIVER = 1,
  /* The driver is there but there is no usable device. */
  CASTMESH_STATUS_NO_DEVICE = 2,
  CASTMESH_STATUS_INVALID_ARGUMENT = 3,
  CASTMESH_STATUS_UNIMPLEMENTED = 4,
  CASTMESH_STATUS_INTERNAL = 5,
  /* 1.1: a queue or a resource is full (send queue, memory registration
   * limits); retry after completions were polled or memory was released. */
  CASTMESH_STATUS_RESOURCE_EXHAUSTED = 6,
  /* 1.1: the object is not in a state that allows the call (posting on an
   * endpoint that is not connected or has failed, releasing a handle twice). */
  CASTMESH_STATUS_FAILED_PRECONDITION = 7,
  /* 1.1: the peer refused access (rkey or range not registered for it). */
  CASTMESH_STATUS_PERMISSION_DENIED = 8,
  /* 1.1: the peer did not answer (retries exhausted, timeout). */
  CASTMESH_STATUS_UNAVAILABLE = 9,
  /* 1.1: the operation was cancelled because an earlier one failed. */
  CASTMESH_STATUS_ABORTED = 10
} castmesh_status_v1;

/* Error details a backend writes into a buffer the core owns. message is
 * always NUL-terminated by the writer and should say how to fix the problem. */
typedef struct castmesh_error_v1 {
  int32_t code; /* a castmesh_status_v1 */
  char message[512];
} castmesh_error_v1;

typedef enum castmesh_log_level_v1 {
  CASTMESH_LOG_LEVEL_DEBUG = 0,
  CASTMESH_LOG_LEVEL_INFO = 1,
  CASTMESH_LOG_LEVEL_WARN = 2,
  CASTMESH_LOG_LEVEL_ERROR = 3
} castmesh_log_level_v1;

/* Services the core offers a backend, so the backend never links the core.
 * Owned by the core; valid from castmesh_backend_init_v1 until shutdown
 * returns. All functions are thread-safe. */
typedef struct castmesh_host_api_v1 {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  /* Version string of the core library, e.g. "0.1.0". */
  const char* core_version;
  /* Writes one line to the core's log (level from CASTMESH_LOG). */
  void (*log)(castmesh_log_level_v1 level, const char* backend_name, const char* message);
  /* Memory the core may later free or hand to other backends. alignment must
   * be a power of two; host_free(NULL) is a no-op. */
  void* (*host_alloc)(size_t size, size_t alignment);
  void (*host_free)(void* ptr);
} castmesh_host_api_v1;

/* Kinds of device a backend can report. */
typedef enum castmesh_device_kind_v1 {
  CASTMESH_DEVICE_KIND_OTHER = 0,
  CASTMESH_DEVICE_KIND_CUDA = 1,
  CASTMESH_DEVICE_KIND_HIP = 2,
  CASTMESH_DEVICE_KIND_RDMA_NIC = 3
} castmesh_device_kind_v1;

/* One device found by a backend's capability query. The core sets
 * struct_size before the call; the backend fills the rest. */
typedef struct castmesh_device_info_v1 {
  size_t struct_size;
  int32_t kind;  /* a castmesh_device_kind_v1 */
  int32_t index; /* backend-local ordinal */
  char name[128];
  uint64_t memory_bytes; /* device memory, or max registrable memory for a NIC; 0 if unknown */
  /* Free-form facts, "key=value" separated by spaces
   * (e.g. "compute_capability=9.0", "ports=1 fw=20.31.1014"). */
  char detail[256];
} castmesh_device_info_v1;

/* ---- ABI 1.1: one-sided RDMA over a NIC (the rdma backend) ----
 *
 * The core opens one device per NIC it uses, registers the memory it exposes
 * (getting an rkey for the peer and an lkey for itself), creates one reliable
 * connection (RC) endpoint per peer, exchanges the endpoints' connection blobs
 * inside its own messages, connects, then posts READ/WRITE lists and polls
 * their completions. Nothing here blocks.
 *
 * Threads: every function may be called from any thread; calls on one device
 * are serialised by the backend (one lock per device). A device must not be
 * used during or after close_device. */

/* An open NIC port with its protection domain. Opaque; from open_device. */
typedef struct castmesh_rdma_device_v1 castmesh_rdma_device_v1;

/* Access a registration grants (bit flags, values of the ABI). */
enum {
  CASTMESH_RDMA_ACCESS_LOCAL_WRITE = 1u,  /* the NIC may write it (needed for READ's destination) */
  CASTMESH_RDMA_ACCESS_REMOTE_READ = 2u,  /* peers may READ it with the rkey */
  CASTMESH_RDMA_ACCESS_REMOTE_WRITE = 4u  /* peers may WRITE it with the rkey (implies LOCAL_WRITE) */
};

/* A memory registration. MR and endpoint handles are never 0 and never
 * reused within a device, so a stale handle gets FAILED_PRECONDITION. */
typedef struct castmesh_rdma_mr_info_v1 {
  size_t struct_size; /* set by the caller */
  uint64_t handle;    /* for deregister_memory */
  uint64_t addr;      /* the registration's whole range, which may */
  uint64_t length;    /* exceed the requested one on a cache hit */
  uint32_t lkey;
  uint32_t rkey;
  uint32_t access;    /* CASTMESH_RDMA_ACCESS_* the registration grants */
  uint32_t refs;      /* references after this call (1 = new registration) */
} castmesh_rdma_mr_info_v1;

/* An endpoint's connection data, sent to the peer by the core. Fixed layout,
 * multi-byte integers big-endian:
 *   0 magic "CMRC" | 4 u16 version (1) | 6 u8 path MTU (IBV_MTU_* 1..5)
 *   7 u8 link layer (1 InfiniBand, 2 Ethernet/RoCE) | 8 u16 LID | 10 u16 0
 *   12 u32 QP number (< 2^24) | 16 u32 first PSN (< 2^24) | 20 16-byte GID */
#define CASTMESH_RDMA_ENDPOINT_BLOB_SIZE 36

/* castmesh_rdma_op_v1.opcode */
enum {
  CASTMESH_RDMA_OP_READ = 1, /* remote -> local */
  CASTMESH_RDMA_OP_WRITE = 2 /* local -> remote */
};
/* castmesh_rdma_op_v1.flags */
enum {
  CASTMESH_RDMA_OP_SIGNALED = 1u /* this op gets its own completion */
};

/* One READ or WRITE. Fixed layout in 1.x (a later op kind gets a new struct
 * and a new function). */
typedef struct castmesh_rdma_op_v1 {
  uint64_t wr_id;       /* the caller's id, returned in its completion */
  uint32_t opcode;      /* CASTMESH_RDMA_OP_READ or _WRITE */
  uint32_t flags;       /* CASTMESH_RDMA_OP_SIGNALED or 0 */
  uint64_t local_addr;  /* inside a registration of this device */
  uint64_t remote_addr; /* inside the peer's registration named by rkey */
  uint64_t length;      /* bytes; at most the port's max message size */
  uint32_t lkey;
  uint32_t rkey;
} castmesh_rdma_op_v1;

/* One completion. status is a castmesh_status_v1: OK, PERMISSION_DENIED
 * (remote access), UNAVAILABLE (peer unreachable), ABORTED (flushed because
 * an earlier op failed), INVALID_ARGUMENT (a local key/range/length error) or
 * INTERNAL (NIC or protocol fault). Fixed layout in 1.x. */
typedef struct castmesh_rdma_completion_v1 {
  uint64_t wr_id;
  int32_t status;
  uint32_t opcode;     /* CASTMESH_RDMA_OP_*, 0 when the NIC did not say (errors) */
  int32_t wc_status;   /* the raw enum ibv_wc_status, for logs */
  uint32_t vendor_err; /* the NIC's own error code, for logs */
  char message[256];   /* NUL-terminated; what happened and what to check */
} castmesh_rdma_completion_v1;

/* The rdma backend's operations (castmesh_backend_v1.rdma). Every function
 * returns a castmesh_status_v1 and fills *error unless it returns OK. */
typedef struct castmesh_rdma_table_v1 {
  size_t struct_size;
  /* Opens port `port` (0 means 1) of the NIC named `name` (NULL or "" means
   * the first NIC whose port is active) with GID table entry gid_index, and
   * allocates its protection domain. NO_DEVICE if there is no such NIC or
   * its port is not active. */
  int32_t (*open_device)(const char* name, uint32_t port, uint32_t gid_index, castmesh_rdma_device_v1** device,
                         castmesh_error_v1* error);
  /* Destroys the device's endpoints and registrations still alive, then the
   * device. NULL is a no-op. */
  void (*close_device)(castmesh_rdma_device_v1* device);
  /* Registers [addr, addr+length) with `access` (CASTMESH_RDMA_ACCESS_*), or
   * takes another reference on a live registration that covers the range
   * and grants at least that access. info->struct_size must be set. */
  int32_t (*register_memory)(castmesh_rdma_device_v1* device, void* addr, uint64_t length, uint32_t access,
                             castmesh_rdma_mr_info_v1* info, castmesh_error_v1* error);
  /* Drops one reference; the last one deregisters. FAILED_PRECONDITION for a
   * handle that is not live. */
  int32_t (*deregister_memory)(castmesh_rdma_device_v1* device, uint64_t handle, castmesh_error_v1* error);
  /* Creates an RC endpoint (queue pair + completion queue) with room for
   * send_queue_depth outstanding ops (0: 128) and writes its connection blob
   * (CASTMESH_RDMA_ENDPOINT_BLOB_SIZE bytes) into blob. */
  int32_t (*create_endpoint)(castmesh_rdma_device_v1* device, uint32_t send_queue_depth, uint64_t* endpoint,
                             uint8_t* blob, castmesh_error_v1* error);
  /* Connects to the peer whose blob the core received (RESET->INIT->RTR->RTS).
   * INVALID_ARGUMENT for a malformed blob (the endpoint stays usable);
   * a failed transition leaves the endpoint failed. */
  int32_t (*connect_endpoint)(castmesh_rdma_device_v1* device, uint64_t endpoint, const uint8_t* peer_blob,
                              size_t peer_blob_size, castmesh_error_v1* error);
  /* Destroys an endpoint; its unpolled completions are dropped. */
  int32_t (*destroy_endpoint)(castmesh_rdma_device_v1* device, uint64_t endpoint, castmesh_error_v1* error);
  /* Posts count ops as one list. Only the last op and those flagged
   * SIGNALED produce a completion (an op that fails always does, and the ops
   * after it complete ABORTED). All or nothing when the send queue is full:
   * RESOURCE_EXHAUSTED, nothing posted, poll and retry (the backend never
   * queues); a list longer than the queue is INVALID_ARGUMENT. *posted says
   * how many ops reached the NIC. An op's memory stays in use until the
   * completion of that op or of a later op of the endpoint is polled. */
  int32_t (*post)(castmesh_rdma_device_v1* device, uint64_t endpoint, const castmesh_rdma_op_v1* ops,
                  uint32_t count, uint32_t* posted, castmesh_error_v1* error);
  /* Writes up to capacity completions and their number into *count, without
   * blocking. The first failed completion leaves the endpoint failed: later
   * posts get FAILED_PRECONDITION naming that failure. */
  int32_t (*poll)(castmesh_rdma_device_v1* device, uint64_t endpoint, castmesh_rdma_completion_v1* completions,
                  uint32_t capacity, uint32_t* count, castmesh_error_v1* error);
} castmesh_rdma_table_v1;

/* ---- ABI 1.1: device memory, streams and collectives (tensor_engine) ----
 *
 * A thin, vendor-neutral layer over the CUDA (or HIP) runtime and NCCL (or
 * RCCL). Work is enqueued on a stream and runs in stream order; nothing here
 * waits for device work except stream_synchronize and event_synchronize.
 * The collective library is opened at first use of a comm_* or collective
 * function; without it every such call returns NO_DRIVER saying what to
 * install, and memory, streams, events and copies keep working.
 *
 * Threads: every function may be called from any thread. Stream, event and
 * communicator handles may be shared between threads, but one communicator's
 * collectives must be enqueued in the same order on every rank (the NCCL
 * rule), and group_begin/group_end bracket the calls of one thread. A handle
 * must not be used during or after its destroy call. Buffers must stay alive
 * until the work that uses them has completed (an event recorded after it
 * reports done). */

typedef struct castmesh_te_stream_v1 castmesh_te_stream_v1; /* opaque; from stream_create */
typedef struct castmesh_te_event_v1 castmesh_te_event_v1;   /* opaque; from event_create */
typedef struct castmesh_te_comm_v1 castmesh_te_comm_v1;     /* opaque; from comm_create */

/* The communicator's rendezvous id: one rank creates it (comm_unique_id), the
 * core sends the bytes to every rank, each passes them to comm_create. The
 * size is NCCL's (and RCCL's) ncclUniqueId. */
#define CASTMESH_TE_UNIQUE_ID_BYTES 128
typedef struct castmesh_te_unique_id_v1 {
  uint8_t bytes[CASTMESH_TE_UNIQUE_ID_BYTES];
} castmesh_te_unique_id_v1;

/* Element types of device collectives (values of the ABI). */
typedef enum castmesh_te_dtype_v1 {
  CASTMESH_TE_DTYPE_INT8 = 0,
  CASTMESH_TE_DTYPE_UINT8 = 1,
  CASTMESH_TE_DTYPE_INT32 = 2,
  CASTMESH_TE_DTYPE_UINT32 = 3,
  CASTMESH_TE_DTYPE_INT64 = 4,
  CASTMESH_TE_DTYPE_UINT64 = 5,
  CASTMESH_TE_DTYPE_FLOAT16 = 6,
  CASTMESH_TE_DTYPE_FLOAT32 = 7,
  CASTMESH_TE_DTYPE_FLOAT64 = 8,
  CASTMESH_TE_DTYPE_BFLOAT16 = 9
} castmesh_te_dtype_v1;

/* Reductions of device collectives (values of the ABI). */
typedef enum castmesh_te_reduce_op_v1 {
  CASTMESH_TE_REDUCE_SUM = 0,
  CASTMESH_TE_REDUCE_PROD = 1,
  CASTMESH_TE_REDUCE_MAX = 2,
  CASTMESH_TE_REDUCE_MIN = 3,
  CASTMESH_TE_REDUCE_AVG = 4
} castmesh_te_reduce_op_v1;

/* Direction of a copy (values of the ABI). Host memory may be pageable or
 * pinned: a host source may be reused as soon as copy returns, a host
 * destination may be read once the stream (or an event recorded after the
 * copy) completed; only pinned memory lets the copy overlap other work. */
typedef enum castmesh_te_copy_kind_v1 {
  CASTMESH_TE_COPY_HOST_TO_DEVICE = 1,
  CASTMESH_TE_COPY_DEVICE_TO_HOST = 2,
  CASTMESH_TE_COPY_DEVICE_TO_DEVICE = 3
} castmesh_te_copy_kind_v1;

/* The tensor_engine backend's operations (castmesh_backend_v1.tensor_engine).
 * Every function returns a castmesh_status_v1 and fills *error unless it
 * returns OK; the message names the failing runtime call and how to fix it.
 * `device` is the backend-local ordinal of query_devices. */
typedef struct castmesh_tensor_engine_table_v1 {
  size_t struct_size;
  /* Device memory of `bytes` (> 0) on `device`; RESOURCE_EXHAUSTED when full. */
  int32_t (*device_alloc)(int32_t device, uint64_t bytes, void** ptr, castmesh_error_v1* error);
  /* Frees device_alloc memory after the device finished with it; NULL is a no-op. */
  int32_t (*device_free)(void* ptr, castmesh_error_v1* error);
  /* Page-locked host memory (fast, asynchronous copies). */
  int32_t (*pinned_alloc)(uint64_t bytes, void** ptr, castmesh_error_v1* error);
  /* Frees pinned_alloc memory; NULL is a no-op. */
  int32_t (*pinned_free)(void* ptr, castmesh_error_v1* error);
  /* A stream on `device` that does not synchronise with the legacy default stream. */
  int32_t (*stream_create)(int32_t device, castmesh_te_stream_v1** stream, castmesh_error_v1* error);
  /* Destroys a stream once its pending work is done (the call does not wait). */
  int32_t (*stream_destroy)(castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* *done = 1 when every piece of work enqueued so far has completed, else 0. */
  int32_t (*stream_query)(castmesh_te_stream_v1* stream, int32_t* done, castmesh_error_v1* error);
  /* Blocks the calling thread until the stream's work enqueued so far completed. */
  int32_t (*stream_synchronize)(castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* An event (timing disabled) on `device`. */
  int32_t (*event_create)(int32_t device, castmesh_te_event_v1** event, castmesh_error_v1* error);
  int32_t (*event_destroy)(castmesh_te_event_v1* event, castmesh_error_v1* error);
  /* Captures the work enqueued on `stream` so far; the event completes when it has. */
  int32_t (*event_record)(castmesh_te_event_v1* event, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* *done = 1 when the captured work completed (or the event was never recorded). */
  int32_t (*event_query)(castmesh_te_event_v1* event, int32_t* done, castmesh_error_v1* error);
  /* Blocks the calling thread until the event completed. */
  int32_t (*event_synchronize)(castmesh_te_event_v1* event, castmesh_error_v1* error);
  /* Work enqueued on `stream` after this call waits for the event (no host wait). */
  int32_t (*stream_wait_event)(castmesh_te_stream_v1* stream, castmesh_te_event_v1* event, castmesh_error_v1* error);
  /* Copies `bytes` in the direction `kind` (castmesh_te_copy_kind_v1), in stream order. */
  int32_t (*copy)(void* dst, const void* src, uint64_t bytes, int32_t kind, castmesh_te_stream_v1* stream,
                  castmesh_error_v1* error);
  /* A fresh rendezvous id for a new communicator (called on one rank). */
  int32_t (*comm_unique_id)(castmesh_te_unique_id_v1* id, castmesh_error_v1* error);
  /* Joins communicator `id` as `rank` of `nranks` on `device`. Blocks until
   * every rank joined (the collective library's rule). */
  int32_t (*comm_create)(int32_t device, const castmesh_te_unique_id_v1* id, int32_t nranks, int32_t rank,
                         castmesh_te_comm_v1** comm, castmesh_error_v1* error);
  /* Frees a communicator whose work completed. */
  int32_t (*comm_destroy)(castmesh_te_comm_v1* comm, castmesh_error_v1* error);
  /* Aborts the communicator's pending work (a peer died or hung) and frees it:
   * blocked collectives end, their streams move on, the buffers' contents are undefined. */
  int32_t (*comm_abort)(castmesh_te_comm_v1* comm, castmesh_error_v1* error);
  /* OK while the communicator is healthy, else the asynchronous error its
   * device work hit (a peer failure, a network error), which the caller
   * handles by aborting. Does not block. */
  int32_t (*comm_async_error)(castmesh_te_comm_v1* comm, castmesh_error_v1* error);
  /* Collectives, enqueued on `stream`; counts are elements of dtype. */
  int32_t (*allreduce)(castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                       int32_t op, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  int32_t (*broadcast)(castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                       int32_t root, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* recv holds nranks * send_count elements, rank r's at r * send_count. */
  int32_t (*allgather)(castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t send_count,
                       int32_t dtype, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* send holds nranks * recv_count elements; rank r receives the reduced block r. */
  int32_t (*reduce_scatter)(castmesh_te_comm_v1* comm, const void* send, void* recv, uint64_t recv_count,
                            int32_t dtype, int32_t op, castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* Point to point; a rank that both sends and receives must bracket the
   * calls with group_begin/group_end, or the two ranks block each other. */
  int32_t (*send)(castmesh_te_comm_v1* comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                  castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  int32_t (*recv)(castmesh_te_comm_v1* comm, void* buf, uint64_t count, int32_t dtype, int32_t peer,
                  castmesh_te_stream_v1* stream, castmesh_error_v1* error);
  /* Collectives called by this thread between the two are launched together at group_end. */
  int32_t (*group_begin)(castmesh_error_v1* error);
  int32_t (*group_end)(castmesh_error_v1* error);

  /* ---- appended later in 1.1: native streams (the DLPack stream protocol) ----
   * A reader touches these only if struct_size reaches past them: tables of
   * earlier 1.1 builds end at group_end, and the core then reports that the
   * plugin predates the stream protocol. */
  /* A handle for a stream the runtime made elsewhere: `native` is a
   * cudaStream_t / hipStream_t of `device` (e.g. a framework's current
   * stream), or a runtime's special value (CUDA: 0x1 cudaStreamLegacy, 0x2
   * cudaStreamPerThread; HIP: 0, the null stream), exactly the integers
   * DLPack's __dlpack__(stream=...) passes. Work enqueued through the handle
   * runs on that stream; stream_destroy frees the handle only, never the
   * native stream, which must outlive the handle. */
  int32_t (*stream_wrap)(int32_t device, void* native, castmesh_te_stream_v1** stream, castmesh_error_v1* error);
  /* The runtime's stream behind `stream` (made by stream_create or
   * stream_wrap): the integer to pass as DLPack's stream. */
  int32_t (*stream_native)(castmesh_te_stream_v1* stream, void** native, castmesh_error_v1* error);
} castmesh_tensor_engine_table_v1;

/* The table a backend returns. Static storage in the backend; never freed. */
typedef struct castmesh_backend_v1 {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* name;    /* e.g. "rdma"; [a-z0-9_]+ */
  const char* version; /* the backend's own version, e.g. "0.1.0" */

  /* Opens the driver. Returns OK, or NO_DRIVER / NO_DEVICE / other with
   * *error filled in. Called once, before any other function below. */
  int32_t (*init)(castmesh_error_v1* error);
  /* Releases everything init acquired. Called at most once, last: the core
   * calls it when it stops using an initialised backend (e.g. no device);
   * a backend still in use at process exit is not shut down. */
  void (*shutdown)(void);
  /* Capability query: writes up to capacity entries into devices and the
   * number found into *count (which may exceed capacity). Returns OK with
   * *count == 0 only if the backend legitimately has no devices; a backend
   * that needs a device returns NO_DEVICE with *error saying so. */
  int32_t (*query_devices)(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                           castmesh_error_v1* error);

  /* ---- 1.1 ---- */
  /* One-sided RDMA; NULL for a backend without it. A reader touches this
   * field only if struct_size reaches past it (a 1.0 table ends above). */
  const struct castmesh_rdma_table_v1* rdma;
  /* Device memory, streams, copies and device collectives; NULL for a backend
   * without them. Read only if struct_size reaches past it (the rdma-era 1.1
   * tables of earlier builds end above). */
  const struct castmesh_tensor_engine_table_v1* tensor_engine;
} castmesh_backend_v1;

#if defined(__GNUC__)
#define CASTMESH_BACKEND_EXPORT __attribute__((visibility("default")))
#else
#define CASTMESH_BACKEND_EXPORT
#endif

/* The entry symbol a backend defines (with CASTMESH_BACKEND_EXPORT). Returns
 * NULL only if the backend cannot work with this host API at all. */
CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host);

/* Signature of the entry symbol, for dlsym(). */
typedef const castmesh_backend_v1* (*castmesh_backend_init_v1_fn)(const castmesh_host_api_v1* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKEND_ABI_H_ */
