/* rdma backend: RDMA NICs through libibverbs.
 *
 * Today it answers the capability query (the devices ibv_get_device_list
 * finds, with ibv_query_device facts); RdmaBuffer operations are added to the
 * table in later ABI minors. Without a device it reports NO_DEVICE and the
 * core's transport carries RDMA traffic instead. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "castmesh/backend_abi.h"

#ifndef CASTMESH_BACKEND_VERSION
#error "CASTMESH_BACKEND_VERSION must be defined by the build"
#endif

/* Set once by castmesh_backend_init_v1, before any other call. */
static const castmesh_host_api_v1* g_host;

static void set_error(castmesh_error_v1* error, int32_t code, const char* format, ...) {
  va_list args;
  if (error == NULL) return;
  error->code = code;
  va_start(args, format);
  vsnprintf(error->message, sizeof error->message, format, args);
  va_end(args);
}

static void log_line(castmesh_log_level_v1 level, const char* message) {
  if (g_host != NULL && g_host->log != NULL) g_host->log(level, "rdma", message);
}

static int32_t rdma_init(castmesh_error_v1* error) {
  (void)error; /* libibverbs is linked; nothing to open until a device is used */
  return CASTMESH_STATUS_OK;
}

static void rdma_shutdown(void) {}

static const char* transport_name(enum ibv_transport_type transport) {
  switch (transport) {
    case IBV_TRANSPORT_IB: return "ib";
    case IBV_TRANSPORT_IWARP: return "iwarp";
    case IBV_TRANSPORT_USNIC: return "usnic";
    case IBV_TRANSPORT_USNIC_UDP: return "usnic_udp";
    default: return "unknown";
  }
}

/* Fills one entry from an open device; leaves zeros where the query fails. */
static void describe_device(struct ibv_device* device, int index, castmesh_device_info_v1* out) {
  struct ibv_context* context;
  struct ibv_device_attr attr;
  out->kind = CASTMESH_DEVICE_KIND_RDMA_NIC;
  out->index = index;
  snprintf(out->name, sizeof out->name, "%s", ibv_get_device_name(device));
  out->memory_bytes = 0;
  snprintf(out->detail, sizeof out->detail, "transport=%s", transport_name(device->transport_type));
  context = ibv_open_device(device);
  if (context == NULL) {
    snprintf(out->detail, sizeof out->detail, "transport=%s open_error=%s", transport_name(device->transport_type),
             strerror(errno));
    return;
  }
  memset(&attr, 0, sizeof attr);
  if (ibv_query_device(context, &attr) == 0) {
    out->memory_bytes = attr.max_mr_size;
    snprintf(out->detail, sizeof out->detail, "transport=%s ports=%u fw=%s max_qp=%d max_mr=%d",
             transport_name(device->transport_type), (unsigned)attr.phys_port_cnt, attr.fw_ver, attr.max_qp,
             attr.max_mr);
  }
  ibv_close_device(context);
}

static int32_t rdma_query_devices(castmesh_device_info_v1* devices, uint32_t capacity, uint32_t* count,
                                  castmesh_error_v1* error) {
  int found = 0;
  int i;
  struct ibv_device** list;
  *count = 0;
  errno = 0;
  list = ibv_get_device_list(&found);
  if (list == NULL) {
    if (errno == ENOSYS) {
      /* No uverbs devices in sysfs: the kernel has no RDMA NIC to offer. */
      set_error(error, CASTMESH_STATUS_NO_DEVICE,
                "no RDMA device: the kernel exposes no RDMA verbs devices (ibv_get_device_list: %s; needs an "
                "RDMA NIC and the ib_uverbs module); castmesh's TCP/Unix transport carries RDMA buffers instead",
                strerror(errno));
      return CASTMESH_STATUS_NO_DEVICE;
    }
    set_error(error, CASTMESH_STATUS_NO_DRIVER, "ibv_get_device_list failed: %s", strerror(errno));
    return CASTMESH_STATUS_NO_DRIVER;
  }
  if (found == 0) {
    ibv_free_device_list(list);
    set_error(error, CASTMESH_STATUS_NO_DEVICE,
              "no RDMA device (ibv_get_device_list found none); castmesh's TCP/Unix transport carries "
              "RDMA buffers instead");
    return CASTMESH_STATUS_NO_DEVICE;
  }
  for (i = 0; i < found && (uint32_t)i < capacity; ++i) {
    if (devices[i].struct_size < sizeof(castmesh_device_info_v1)) break;
    describe_device(list[i], i, &devices[i]);
  }
  *count = (uint32_t)found;
  ibv_free_device_list(list);
  {
    char line[64];
    snprintf(line, sizeof line, "%d RDMA device(s) found", found);
    log_line(CASTMESH_LOG_LEVEL_DEBUG, line);
  }
  return CASTMESH_STATUS_OK;
}

static const castmesh_backend_v1 kRdmaBackend = {
    sizeof(castmesh_backend_v1),
    CASTMESH_BACKEND_ABI_MAJOR,
    CASTMESH_BACKEND_ABI_MINOR,
    "rdma",
    CASTMESH_BACKEND_VERSION,
    &rdma_init,
    &rdma_shutdown,
    &rdma_query_devices,
};

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  if (host == NULL || host->abi_major != CASTMESH_BACKEND_ABI_MAJOR ||
      host->struct_size < offsetof(castmesh_host_api_v1, host_free) + sizeof host->host_free) {
    return NULL;
  }
  g_host = host;
  return &kRdmaBackend;
}
