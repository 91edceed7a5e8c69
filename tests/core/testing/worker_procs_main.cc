// main() of the test binaries whose tests start worker procs: the
// allocators re-execute this same binary as each worker, and
// castmesh::init() turns that process into a worker (it never returns
// there). Linked by castmesh_add_gtest(... WORKER_PROCS).
#include <gtest/gtest.h>

#include "castmesh/proc_mesh.h"

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs never return from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
