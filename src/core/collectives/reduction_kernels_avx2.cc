// The kernel table for x86-64 CPUs with AVX2 and F16C: the same loops as the
// portable table (reduction_loops.h), compiled with -mavx2 -mf16c, so they
// are vectorised 8 floats wide and float16 converts in hardware. Only built
// on x86-64 with GCC or Clang (CMakeLists.txt); reduction.cc uses it where
// the CPU has both extensions. Nothing else may be defined in this file:
// any code here may contain AVX2 instructions.
#include "core/collectives/reduction_kernels.h"
#include "core/collectives/reduction_loops.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "reduction_kernels_avx2.cc must be compiled with -mavx2 -mf16c"
#endif

namespace castmesh::reduction_kernels {

constinit const KernelTable kAvx2KernelTable = make_kernel_table("avx2+f16c");

}  // namespace castmesh::reduction_kernels
