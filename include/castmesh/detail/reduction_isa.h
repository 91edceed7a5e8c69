// Internal: which instruction set the built-in reduction kernels run with,
// for benchmarks and diagnostics. Not user API.
#pragma once

namespace castmesh::detail {

// The name of the kernel table Reduction::Builtin uses in this process
// ("portable", "avx2+f16c"; src/core/collectives/reduction_kernels.h). Any thread.
const char* reduction_kernel_isa();

}  // namespace castmesh::detail
