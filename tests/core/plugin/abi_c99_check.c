/* Compiled as strict C99 (-Wpedantic -Werror): backend_abi.h must stay plain C. */
#include "castmesh/backend_abi.h"

int castmesh_abi_c99_check(void);
int castmesh_abi_c99_check(void) {
  castmesh_backend_v1 table = {0};
  castmesh_device_info_v1 device = {0};
  /* ABI 1.1 */
  castmesh_rdma_table_v1 rdma = {0};
  castmesh_rdma_mr_info_v1 mr = {0};
  castmesh_rdma_op_v1 op = {0};
  castmesh_rdma_completion_v1 completion = {0};
  table.rdma = &rdma;
  return (int)(sizeof table + sizeof device + sizeof rdma + sizeof mr + sizeof op + sizeof completion) +
         CASTMESH_BACKEND_ABI_MAJOR + CASTMESH_RDMA_ENDPOINT_BLOB_SIZE + (table.rdma != 0);
}
