/* Stands in for a driver library (libcuda, libibverbs) that a backend links
 * but that is missing at run time. */
__attribute__((visibility("default"))) int castmesh_test_dependency(void) { return 42; }
