/* The rdma backend's logic over a rdma_verbs_ops table: capability query,
 * devices, the memory-registration cache, RC endpoints (connection blob and
 * the RESET->INIT->RTR->RTS state machine), posting READ/WRITE lists with
 * selective signalling and send-queue accounting, and completion polling with
 * every ibv_wc_status mapped to a castmesh status and message.
 *
 * Compiled into the plugin (with rdma_real_verbs()) and into the unit tests'
 * static library (with the fake provider). The functions after
 * rdma_engine_open_device have the contracts of castmesh_rdma_table_v1's
 * entries of the same name (backend_abi.h); a device remembers the ops table
 * it was opened with. */
#ifndef CASTMESH_BACKENDS_RDMA_ENGINE_H_
#define CASTMESH_BACKENDS_RDMA_ENGINE_H_

#include "castmesh/backend_abi.h"
#include "rdma_verbs_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* castmesh_backend_v1.query_devices over `ops`. */
int32_t rdma_engine_query_devices(const struct rdma_verbs_ops* ops, castmesh_device_info_v1* devices,
                                  uint32_t capacity, uint32_t* count, castmesh_error_v1* error);

/* castmesh_rdma_table_v1.open_device over `ops`. */
int32_t rdma_engine_open_device(const struct rdma_verbs_ops* ops, const char* name, uint32_t port,
                                uint32_t gid_index, castmesh_rdma_device_v1** device, castmesh_error_v1* error);
void rdma_engine_close_device(castmesh_rdma_device_v1* device);
int32_t rdma_engine_register_memory(castmesh_rdma_device_v1* device, void* addr, uint64_t length, uint32_t access,
                                    castmesh_rdma_mr_info_v1* info, castmesh_error_v1* error);
int32_t rdma_engine_deregister_memory(castmesh_rdma_device_v1* device, uint64_t handle, castmesh_error_v1* error);
int32_t rdma_engine_create_endpoint(castmesh_rdma_device_v1* device, uint32_t send_queue_depth, uint64_t* endpoint,
                                    uint8_t* blob, castmesh_error_v1* error);
int32_t rdma_engine_connect_endpoint(castmesh_rdma_device_v1* device, uint64_t endpoint, const uint8_t* peer_blob,
                                     size_t peer_blob_size, castmesh_error_v1* error);
int32_t rdma_engine_destroy_endpoint(castmesh_rdma_device_v1* device, uint64_t endpoint, castmesh_error_v1* error);
int32_t rdma_engine_post(castmesh_rdma_device_v1* device, uint64_t endpoint, const castmesh_rdma_op_v1* ops,
                         uint32_t count, uint32_t* posted, castmesh_error_v1* error);
int32_t rdma_engine_poll(castmesh_rdma_device_v1* device, uint64_t endpoint, castmesh_rdma_completion_v1* completions,
                         uint32_t capacity, uint32_t* count, castmesh_error_v1* error);

/* The castmesh status for an enum ibv_wc_status value, and (if message is not
 * NULL) a sentence saying what it means; unknown values are INTERNAL. */
int32_t rdma_engine_wc_status(int wc_status, const char** message);

/* The device's send-queue slots in use on an endpoint (posted ops whose
 * completion has not been polled yet), or -1 for an unknown endpoint. For
 * tests and diagnostics. */
int64_t rdma_engine_outstanding(castmesh_rdma_device_v1* device, uint64_t endpoint);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKENDS_RDMA_ENGINE_H_ */
