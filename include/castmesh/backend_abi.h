/* castmesh backend plugin ABI, version 1 (plain C; see docs/design: plugins).
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
 */
#ifndef CASTMESH_BACKEND_ABI_H_
#define CASTMESH_BACKEND_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CASTMESH_BACKEND_ABI_MAJOR 1
#define CASTMESH_BACKEND_ABI_MINOR 0

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
  CASTMESH_STATUS_INTERNAL = 5
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
