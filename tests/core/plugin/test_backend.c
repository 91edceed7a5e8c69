/* A configurable fake backend for the plugin loader's tests, built several
 * times with different macros:
 *   TEST_BACKEND_NAME    backend name (file is libcastmesh_<name>.so)
 *   TEST_ABI_MAJOR       abi_major it claims (default: the real one)
 *   TEST_ABI_MINOR       abi_minor it claims (default: the real one)
 *   TEST_TABLE_SIZE      struct_size it claims (default: the real one)
 *   TEST_RDMA_TABLE_SIZE define to offer an rdma table (1.1) of this struct_size,
 *                        whose functions answer UNIMPLEMENTED naming this backend
 *   TEST_TE_TABLE_SIZE   define to offer a tensor_engine table (1.1) of this
 *                        struct_size; device_alloc answers UNIMPLEMENTED naming
 *                        this backend, the other entries are never called
 *   TEST_INIT_STATUS     what init returns (default OK)
 *   TEST_DEVICE_COUNT    devices its query reports (default 1)
 *   TEST_NO_ENTRY        define to export no entry symbol at all
 *   TEST_USE_DEPENDENCY  define to call into libcastmesh_test_dep.so */
#include <stdio.h>

#include "castmesh/backend_abi.h"

#ifndef TEST_ABI_MAJOR
#define TEST_ABI_MAJOR CASTMESH_BACKEND_ABI_MAJOR
#endif
#ifndef TEST_ABI_MINOR
#define TEST_ABI_MINOR CASTMESH_BACKEND_ABI_MINOR
#endif
#ifndef TEST_TABLE_SIZE
#define TEST_TABLE_SIZE sizeof(castmesh_backend_v1)
#endif
#ifndef TEST_INIT_STATUS
#define TEST_INIT_STATUS CASTMESH_STATUS_OK
#endif
#ifndef TEST_DEVICE_COUNT
#define TEST_DEVICE_COUNT 1
#endif

#ifdef TEST_USE_DEPENDENCY
int castmesh_test_dependency(void);
#endif

static const castmesh_host_api_v1* g_host;
static const uint32_t kDeviceCount = TEST_DEVICE_COUNT;

static int32_t test_init(castmesh_error_v1* error) {
  if (TEST_INIT_STATUS != CASTMESH_STATUS_OK) {
    error->code = TEST_INIT_STATUS;
    snprintf(error->message, sizeof error->message, "test backend init says %d", (int)TEST_INIT_STATUS);
  }
  return TEST_INIT_STATUS;
}

static void test_shutdown(void) {}

static int32_t test_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                                  castmesh_error_v1* error) {
  uint32_t i;
  if (kDeviceCount == 0) {
    error->code = CASTMESH_STATUS_NO_DEVICE;
    snprintf(error->message, sizeof error->message, "test backend has no device");
    return CASTMESH_STATUS_NO_DEVICE;
  }
  for (i = 0; i < kDeviceCount && i < capacity; ++i) {
    devices[i].kind = CASTMESH_DEVICE_KIND_OTHER;
    devices[i].index = (int32_t)i;
    snprintf(devices[i].name, sizeof devices[i].name, "test-device-%u", (unsigned)i);
    devices[i].memory_bytes = 1024u * (i + 1u);
#ifdef TEST_USE_DEPENDENCY
    snprintf(devices[i].detail, sizeof devices[i].detail, "dep=%d", castmesh_test_dependency());
#else
    snprintf(devices[i].detail, sizeof devices[i].detail, "core=%s", g_host->core_version);
#endif
  }
  *count = kDeviceCount;
  if (g_host->log != NULL) g_host->log(CASTMESH_LOG_LEVEL_DEBUG, TEST_BACKEND_NAME, "devices queried");
  return CASTMESH_STATUS_OK;
}

#ifdef TEST_RDMA_TABLE_SIZE
/* Lets the loader's test see that the table it gets is this library's. */
static int32_t test_rdma_open(const char* name, uint32_t port, uint32_t gid_index, castmesh_rdma_device_v1** device,
                              castmesh_error_v1* error) {
  (void)name;
  (void)port;
  (void)gid_index;
  *device = NULL;
  error->code = CASTMESH_STATUS_UNIMPLEMENTED;
  snprintf(error->message, sizeof error->message, "%s has no NIC", TEST_BACKEND_NAME);
  return CASTMESH_STATUS_UNIMPLEMENTED;
}
static void test_rdma_close(castmesh_rdma_device_v1* device) { (void)device; }
static int32_t test_rdma_unimplemented(castmesh_error_v1* error) {
  error->code = CASTMESH_STATUS_UNIMPLEMENTED;
  snprintf(error->message, sizeof error->message, "%s has no NIC", TEST_BACKEND_NAME);
  return CASTMESH_STATUS_UNIMPLEMENTED;
}
static int32_t test_rdma_register(castmesh_rdma_device_v1* d, void* a, uint64_t l, uint32_t x,
                                  castmesh_rdma_mr_info_v1* i, castmesh_error_v1* error) {
  (void)d, (void)a, (void)l, (void)x, (void)i;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_deregister(castmesh_rdma_device_v1* d, uint64_t h, castmesh_error_v1* error) {
  (void)d, (void)h;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_create(castmesh_rdma_device_v1* d, uint32_t q, uint64_t* e, uint8_t* b,
                                castmesh_error_v1* error) {
  (void)d, (void)q, (void)e, (void)b;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_connect(castmesh_rdma_device_v1* d, uint64_t e, const uint8_t* b, size_t n,
                                 castmesh_error_v1* error) {
  (void)d, (void)e, (void)b, (void)n;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_destroy(castmesh_rdma_device_v1* d, uint64_t e, castmesh_error_v1* error) {
  (void)d, (void)e;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_post(castmesh_rdma_device_v1* d, uint64_t e, const castmesh_rdma_op_v1* o, uint32_t c,
                              uint32_t* p, castmesh_error_v1* error) {
  (void)d, (void)e, (void)o, (void)c, (void)p;
  return test_rdma_unimplemented(error);
}
static int32_t test_rdma_poll(castmesh_rdma_device_v1* d, uint64_t e, castmesh_rdma_completion_v1* c, uint32_t n,
                              uint32_t* k, castmesh_error_v1* error) {
  (void)d, (void)e, (void)c, (void)n, (void)k;
  return test_rdma_unimplemented(error);
}
static const castmesh_rdma_table_v1 kRdmaTable = {
    TEST_RDMA_TABLE_SIZE, &test_rdma_open,    &test_rdma_close,   &test_rdma_register, &test_rdma_deregister,
    &test_rdma_create,    &test_rdma_connect, &test_rdma_destroy, &test_rdma_post,     &test_rdma_poll,
};
#define TEST_RDMA_TABLE (&kRdmaTable)
#else
#define TEST_RDMA_TABLE NULL
#endif

#ifdef TEST_TE_TABLE_SIZE
static int32_t test_te_device_alloc(int32_t device, uint64_t bytes, void** ptr, castmesh_error_v1* error) {
  (void)device;
  (void)bytes;
  *ptr = NULL;
  error->code = CASTMESH_STATUS_UNIMPLEMENTED;
  snprintf(error->message, sizeof error->message, "%s has no device memory", TEST_BACKEND_NAME);
  return CASTMESH_STATUS_UNIMPLEMENTED;
}
/* The loader only checks that entries are present; the test calls device_alloc alone. */
static void test_te_never_called(void) {}
#define TEST_TE_ENTRY(field) \
  ((__typeof__(((castmesh_tensor_engine_table_v1*)0)->field))(void (*)(void))test_te_never_called)
static const castmesh_tensor_engine_table_v1 kTeTable = {
    TEST_TE_TABLE_SIZE,
    &test_te_device_alloc,
    TEST_TE_ENTRY(device_free),
    TEST_TE_ENTRY(pinned_alloc),
    TEST_TE_ENTRY(pinned_free),
    TEST_TE_ENTRY(stream_create),
    TEST_TE_ENTRY(stream_destroy),
    TEST_TE_ENTRY(stream_query),
    TEST_TE_ENTRY(stream_synchronize),
    TEST_TE_ENTRY(event_create),
    TEST_TE_ENTRY(event_destroy),
    TEST_TE_ENTRY(event_record),
    TEST_TE_ENTRY(event_query),
    TEST_TE_ENTRY(event_synchronize),
    TEST_TE_ENTRY(stream_wait_event),
    TEST_TE_ENTRY(copy),
    TEST_TE_ENTRY(comm_unique_id),
    TEST_TE_ENTRY(comm_create),
    TEST_TE_ENTRY(comm_destroy),
    TEST_TE_ENTRY(comm_abort),
    TEST_TE_ENTRY(comm_async_error),
    TEST_TE_ENTRY(allreduce),
    TEST_TE_ENTRY(broadcast),
    TEST_TE_ENTRY(allgather),
    TEST_TE_ENTRY(reduce_scatter),
    TEST_TE_ENTRY(send),
    TEST_TE_ENTRY(recv),
    TEST_TE_ENTRY(group_begin),
    TEST_TE_ENTRY(group_end),
};
#define TEST_TE_TABLE (&kTeTable)
#else
#define TEST_TE_TABLE NULL
#endif

static const castmesh_backend_v1 kTable = {
    TEST_TABLE_SIZE, TEST_ABI_MAJOR, TEST_ABI_MINOR,      TEST_BACKEND_NAME, "9.9.9",
    &test_init,      &test_shutdown, &test_query_devices, TEST_RDMA_TABLE,   TEST_TE_TABLE,
};

#ifndef TEST_NO_ENTRY
CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  g_host = host;
  return &kTable;
}
#else
CASTMESH_BACKEND_EXPORT int castmesh_test_not_an_entry(void) { return kTable.abi_major == 0; }
#endif
