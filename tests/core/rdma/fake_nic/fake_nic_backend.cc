// A FAKE "rdma" backend plugin for tests: the rdma backend's real logic
// (backends/rdma/rdma_engine.c) bound to the fake cross-process verbs
// provider (fake_nic_verbs.h) instead of libibverbs. Built as
// libcastmesh_rdma.so in a folder of its own, which the FakeNic tests put on
// CASTMESH_BACKEND_PATH; never installed.
#include <cstddef>

#include "castmesh/backend_abi.h"
#include "fake_nic_verbs.h"
#include "rdma_engine.h"

namespace {

int32_t fake_init(castmesh_error_v1*) { return CASTMESH_STATUS_OK; }

void fake_shutdown() {}

int32_t fake_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                           castmesh_error_v1* error) {
  return rdma_engine_query_devices(castmesh::fake_nic::ops(), devices, capacity, count, error);
}

int32_t fake_open_device(const char* name, uint32_t port, uint32_t gid_index, castmesh_rdma_device_v1** device,
                         castmesh_error_v1* error) {
  return rdma_engine_open_device(castmesh::fake_nic::ops(), name, port, gid_index, device, error);
}

const castmesh_rdma_table_v1 kFakeRdmaTable = {
    sizeof(castmesh_rdma_table_v1), &fake_open_device,           &rdma_engine_close_device,
    &rdma_engine_register_memory,   &rdma_engine_deregister_memory, &rdma_engine_create_endpoint,
    &rdma_engine_connect_endpoint,  &rdma_engine_destroy_endpoint,  &rdma_engine_post,
    &rdma_engine_poll,
};

// Built field by field: fields a later ABI appends stay zero.
const castmesh_backend_v1* fake_backend() {
  static const castmesh_backend_v1 backend = [] {
    castmesh_backend_v1 made{};
    made.struct_size = sizeof made;
    made.abi_major = CASTMESH_BACKEND_ABI_MAJOR;
    made.abi_minor = CASTMESH_BACKEND_ABI_MINOR;
    made.name = "rdma";
    made.version = "fake-nic";
    made.init = &fake_init;
    made.shutdown = &fake_shutdown;
    made.query_devices = &fake_query_devices;
    made.rdma = &kFakeRdmaTable;
    return made;
  }();
  return &backend;
}

}  // namespace

extern "C" CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(
    const castmesh_host_api_v1* host) {
  if (host == nullptr || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR) return nullptr;
  return fake_backend();
}
