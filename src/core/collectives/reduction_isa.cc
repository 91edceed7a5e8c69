// include/castmesh/detail/reduction_isa.h over the kernel tables.
#include "castmesh/detail/reduction_isa.h"

#include "core/collectives/reduction_kernels.h"

namespace castmesh::detail {

const char* reduction_kernel_isa() { return reduction_kernels::active_kernels().isa; }

}  // namespace castmesh::detail
