/* rdma backend: RDMA NICs through libibverbs.
 *
 * ABI 1.0: the capability query (the devices ibv_get_device_list finds, with
 * ibv_query_device facts); without a device it reports NO_DEVICE and the
 * core's transport carries RDMA traffic instead.
 * ABI 1.1: castmesh_rdma_table_v1 (one-sided READ/WRITE over RC queue pairs,
 * with a memory-registration cache); see backend_abi.h for the contract and
 * docs/rdma.md for how the core uses it.
 *
 * This file only binds the table to the real libibverbs: the logic is in
 * rdma_engine.c, which reaches libibverbs through rdma_verbs_ops so the unit
 * tests (tests/backends/rdma) run it against a fake provider. */
#include "castmesh/backend_abi.h"
#include "rdma_engine.h"
#include "rdma_verbs_ops.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

/* Set once by castmesh_backend_init_v1, before any other call. */
static const castmesh_host_api_v1* g_host;

static int32_t rdma_init(castmesh_error_v1* error) {
  (void)error; /* libibverbs is linked; nothing to open until a device is used */
  return CASTMESH_STATUS_OK;
}

static void rdma_shutdown(void) {}

static int32_t rdma_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                                  castmesh_error_v1* error) {
  const int32_t status = rdma_engine_query_devices(rdma_real_verbs(), devices, capacity, count, error);
  if (status == CASTMESH_STATUS_OK && g_host != NULL && g_host->log != NULL) {
    g_host->log(CASTMESH_LOG_LEVEL_DEBUG, "rdma", *count == 1 ? "1 RDMA device found" : "RDMA devices found");
  }
  return status;
}

static int32_t rdma_open_device(const char* name, uint32_t port, uint32_t gid_index,
                                castmesh_rdma_device_v1** device, castmesh_error_v1* error) {
  return rdma_engine_open_device(rdma_real_verbs(), name, port, gid_index, device, error);
}

static const castmesh_rdma_table_v1 kRdmaTable = {
    sizeof(castmesh_rdma_table_v1),
    &rdma_open_device,
    &rdma_engine_close_device,
    &rdma_engine_register_memory,
    &rdma_engine_deregister_memory,
    &rdma_engine_create_endpoint,
    &rdma_engine_connect_endpoint,
    &rdma_engine_destroy_endpoint,
    &rdma_engine_post,
    &rdma_engine_poll,
};

static const castmesh_backend_v1 kRdmaBackend = {
    sizeof(castmesh_backend_v1),
    CASTMESH_BACKEND_ABI_MAJOR,
    CASTMESH_BACKEND_ABI_MINOR,
    "rdma",
    CASTMESH_BACKEND_VERSION,
    &rdma_init,
    &rdma_shutdown,
    &rdma_query_devices,
    &kRdmaTable,
};

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  if (host == NULL || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR ||
      host->struct_size < offsetof(castmesh_host_api_v1, host_free) + sizeof host->host_free) {
    return NULL;
  }
  g_host = host;
  return &kRdmaBackend;
}
