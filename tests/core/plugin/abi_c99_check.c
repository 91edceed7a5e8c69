/* Compiled as strict C99 (-Wpedantic -Werror): backend_abi.h must stay plain C. */
#include "castmesh/backend_abi.h"

int castmesh_abi_c99_check(void);
int castmesh_abi_c99_check(void) {
  castmesh_backend_v1 table = {0};
  castmesh_device_info_v1 device = {0};
  return (int)(sizeof table + sizeof device) + CASTMESH_BACKEND_ABI_MAJOR;
}
