/* A configurable fake backend for the plugin loader's tests, built several
 * times with different macros:
 *   TEST_BACKEND_NAME    backend name (file is libcastmesh_<name>.so)
 *   TEST_ABI_MAJOR       abi_major it claims (default: the real one)
 *   TEST_TABLE_SIZE      struct_size it claims (default: the real one)
 *   TEST_INIT_STATUS     what init returns (default OK)
 *   TEST_DEVICE_COUNT    devices its query reports (default 1)
 *   TEST_NO_ENTRY        define to export no entry symbol at all
 *   TEST_USE_DEPENDENCY  define to call into libcastmesh_test_dep.so */
#include <stdio.h>

#include "castmesh/backend_abi.h"

#ifndef TEST_ABI_MAJOR
#define TEST_ABI_MAJOR CASTMESH_BACKEND_ABI_MAJOR
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

static const castmesh_backend_v1 kTable = {
    TEST_TABLE_SIZE, TEST_ABI_MAJOR, CASTMESH_BACKEND_ABI_MINOR, TEST_BACKEND_NAME, "9.9.9",
    &test_init,      &test_shutdown, &test_query_devices,
};

#ifndef TEST_NO_ENTRY
CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  g_host = host;
  return &kTable;
}
#else
CASTMESH_BACKEND_EXPORT int castmesh_test_not_an_entry(void) { return kTable.abi_major == 0; }
#endif
