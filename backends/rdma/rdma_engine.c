/* See rdma_engine.h. All device state is guarded by the device's mutex; the
 * verbs objects are only touched with it held, so one device is used by one
 * thread at a time (the core keeps one device per NIC and posts rarely
 * enough that this lock is not the bottleneck; the NIC is). */
#include "rdma_engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kDefaultSendQueueDepth = 128, kPollChunk = 32, kBlobVersion = 1 };
static const uint8_t kBlobMagic[4] = {'C', 'M', 'R', 'C'};

/* Connection defaults: ~67 ms ACK timeout (4.096 us * 2^14), 7 transport
 * and RNR retries (7 = the maximum; RNR does not occur without receives),
 * 12 = 0.64 ms minimal RNR NAK timer. */
enum { kAckTimeout = 14, kRetryCount = 7, kRnrRetry = 7, kMinRnrTimer = 12, kHopLimit = 64 };

typedef enum endpoint_state { kCreated, kConnected, kFailed } endpoint_state;

typedef struct rdma_mr_entry {
  uint64_t handle;
  struct ibv_mr* mr;
  uint64_t addr;
  uint64_t length;
  uint32_t access;
  uint32_t refs;
} rdma_mr_entry;

typedef struct rdma_endpoint {
  uint64_t handle;
  struct ibv_qp* qp;
  struct ibv_cq* cq;
  uint32_t sq_depth;
  uint32_t psn;
  endpoint_state state;
  /* Send-queue accounting: a slot is free again only when the completion of
   * a signalled op at or after it is polled (unsignalled ops retire with the
   * next signalled one), so each signalled op records how many slots it
   * retires, in posting order (RC completes in order). */
  uint32_t outstanding;
  uint32_t unsignaled_run;
  uint32_t* batches; /* ring of sq_depth entries */
  uint32_t batch_head;
  uint32_t batch_count;
  char failure[256]; /* why the endpoint failed */
} rdma_endpoint;

struct castmesh_rdma_device_v1 {
  const struct rdma_verbs_ops* ops;
  pthread_mutex_t mu;
  struct ibv_context* context;
  struct ibv_pd* pd;
  uint8_t port;
  uint32_t gid_index;
  struct ibv_device_attr device_attr;
  struct ibv_port_attr port_attr;
  union ibv_gid gid;
  char name[64];
  uint64_t next_handle; /* shared by MRs and endpoints: never reused */
  rdma_mr_entry** mrs;
  size_t mr_count;
  size_t mr_capacity;
  rdma_endpoint** endpoints;
  size_t endpoint_count;
  size_t endpoint_capacity;
};

static int32_t fail(castmesh_error_v1* error, int32_t code, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
static int32_t fail(castmesh_error_v1* error, int32_t code, const char* format, ...) {
  va_list args;
  if (error == NULL) return code;
  error->code = code;
  va_start(args, format);
  vsnprintf(error->message, sizeof error->message, format, args);
  va_end(args);
  return code;
}

/* ---- capability query ---- */

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
static void describe_device(const struct rdma_verbs_ops* ops, struct ibv_device* device, int index,
                            castmesh_device_info_v1* out) {
  struct ibv_context* context;
  struct ibv_device_attr attr;
  const char* transport = transport_name(device->transport_type);
  out->kind = CASTMESH_DEVICE_KIND_RDMA_NIC;
  out->index = index;
  snprintf(out->name, sizeof out->name, "%s", ops->get_device_name(device));
  out->memory_bytes = 0;
  snprintf(out->detail, sizeof out->detail, "transport=%s", transport);
  context = ops->open_device(device);
  if (context == NULL) {
    snprintf(out->detail, sizeof out->detail, "transport=%s open_error=%s", transport, strerror(errno));
    return;
  }
  memset(&attr, 0, sizeof attr);
  if (ops->query_device(context, &attr) == 0) {
    out->memory_bytes = attr.max_mr_size;
    snprintf(out->detail, sizeof out->detail, "transport=%s ports=%u fw=%s max_qp=%d max_mr=%d", transport,
             (unsigned)attr.phys_port_cnt, attr.fw_ver, attr.max_qp, attr.max_mr);
  }
  ops->close_device(context);
}

/* The device list, or NULL with *error saying why (NO_DEVICE / NO_DRIVER). */
static struct ibv_device** device_list(const struct rdma_verbs_ops* ops, int* found, castmesh_error_v1* error) {
  struct ibv_device** list;
  *found = 0;
  errno = 0;
  list = ops->get_device_list(found);
  if (list == NULL) {
    if (errno == ENOSYS) {
      /* No uverbs devices in sysfs: the kernel has no RDMA NIC to offer. */
      fail(error, CASTMESH_STATUS_NO_DEVICE,
           "no RDMA device: the kernel exposes no RDMA verbs devices (ibv_get_device_list: %s; needs an "
           "RDMA NIC and the ib_uverbs module); castmesh's TCP/Unix transport carries RDMA buffers instead",
           strerror(errno));
    } else {
      fail(error, CASTMESH_STATUS_NO_DRIVER, "ibv_get_device_list failed: %s", strerror(errno));
    }
    return NULL;
  }
  if (*found == 0) {
    ops->free_device_list(list);
    fail(error, CASTMESH_STATUS_NO_DEVICE,
         "no RDMA device (ibv_get_device_list found none); castmesh's TCP/Unix transport carries "
         "RDMA buffers instead");
    return NULL;
  }
  return list;
}

int32_t rdma_engine_query_devices(const struct rdma_verbs_ops* ops, castmesh_device_info_v1* devices,
                                  uint32_t capacity, uint32_t* count, castmesh_error_v1* error) {
  int found = 0;
  int i;
  struct ibv_device** list = device_list(ops, &found, error);
  *count = 0;
  if (list == NULL) return error != NULL ? error->code : CASTMESH_STATUS_NO_DEVICE;
  for (i = 0; i < found && (uint32_t)i < capacity; ++i) {
    if (devices[i].struct_size < sizeof(castmesh_device_info_v1)) break;
    describe_device(ops, list[i], i, &devices[i]);
  }
  *count = (uint32_t)found;
  ops->free_device_list(list);
  return CASTMESH_STATUS_OK;
}

/* ---- devices ---- */

static const char* port_state_name(enum ibv_port_state state) {
  switch (state) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT (no subnet manager?)";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "unknown";
  }
}

/* Opens `device` and checks its port; on success sets the context and port attributes. */
static int32_t open_port(const struct rdma_verbs_ops* ops, struct ibv_device* device, uint8_t port,
                         struct ibv_context** context, struct ibv_port_attr* port_attr, castmesh_error_v1* error) {
  const char* name = ops->get_device_name(device);
  int rc;
  *context = ops->open_device(device);
  if (*context == NULL) {
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "ibv_open_device(%s) failed: %s (is /dev/infiniband readable?)",
                name, strerror(errno));
  }
  memset(port_attr, 0, sizeof *port_attr);
  rc = ops->query_port(*context, port, port_attr);
  if (rc != 0) {
    ops->close_device(*context);
    *context = NULL;
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "ibv_query_port(%s, port %u) failed: %s (no such port?)",
                name, (unsigned)port, strerror(rc));
  }
  if (port_attr->state != IBV_PORT_ACTIVE) {
    ops->close_device(*context);
    *context = NULL;
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "port %u of RDMA device %s is %s, not ACTIVE", (unsigned)port,
                name, port_state_name(port_attr->state));
  }
  return CASTMESH_STATUS_OK;
}

/* Fills the device's attributes, GID and protection domain. */
static int32_t prepare_device(castmesh_rdma_device_v1* device, castmesh_error_v1* error) {
  const struct rdma_verbs_ops* ops = device->ops;
  int rc = ops->query_device(device->context, &device->device_attr);
  if (rc != 0) {
    return fail(error, CASTMESH_STATUS_INTERNAL, "ibv_query_device(%s) failed: %s", device->name, strerror(rc));
  }
  if (device->port > device->device_attr.phys_port_cnt) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "RDMA device %s has %u port(s), port %u was asked for",
                device->name, (unsigned)device->device_attr.phys_port_cnt, (unsigned)device->port);
  }
  if (device->gid_index >= (uint32_t)device->port_attr.gid_tbl_len && device->port_attr.gid_tbl_len > 0) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "GID index %u is past port %u's GID table (%d entries)",
                (unsigned)device->gid_index, (unsigned)device->port, device->port_attr.gid_tbl_len);
  }
  rc = ops->query_gid(device->context, device->port, (int)device->gid_index, &device->gid);
  if (rc != 0) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "ibv_query_gid(%s, port %u, index %u) failed: %s",
                device->name, (unsigned)device->port, (unsigned)device->gid_index, strerror(rc < 0 ? errno : rc));
  }
  device->pd = ops->alloc_pd(device->context);
  if (device->pd == NULL) {
    return fail(error, errno == ENOMEM ? CASTMESH_STATUS_RESOURCE_EXHAUSTED : CASTMESH_STATUS_INTERNAL,
                "ibv_alloc_pd(%s) failed: %s", device->name, strerror(errno));
  }
  return CASTMESH_STATUS_OK;
}

/* Picks and opens the device: the named one, or the first with an active port. */
static int32_t choose_device(castmesh_rdma_device_v1* device, const char* name, castmesh_error_v1* error) {
  const struct rdma_verbs_ops* ops = device->ops;
  int found = 0;
  int i;
  int32_t status = CASTMESH_STATUS_NO_DEVICE;
  char names[256] = "";
  struct ibv_device** list = device_list(ops, &found, error);
  if (list == NULL) return error != NULL ? error->code : CASTMESH_STATUS_NO_DEVICE;
  for (i = 0; i < found; ++i) {
    const char* candidate = ops->get_device_name(list[i]);
    size_t used = strlen(names);
    snprintf(names + used, sizeof names - used, "%s%s", used > 0 ? ", " : "", candidate);
    if (name != NULL && strcmp(name, candidate) != 0) continue;
    status = open_port(ops, list[i], device->port, &device->context, &device->port_attr, error);
    if (status == CASTMESH_STATUS_OK) {
      snprintf(device->name, sizeof device->name, "%s", candidate);
      break;
    }
    if (name != NULL) break; /* the named device's own error stands */
  }
  ops->free_device_list(list);
  if (status == CASTMESH_STATUS_OK) return status;
  if (name != NULL && i == found) {
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "no RDMA device named '%s' (found: %s)", name, names);
  }
  if (name == NULL) {
    char last[sizeof error->message] = "";
    if (error != NULL) snprintf(last, sizeof last, "%s", error->message); /* fail() overwrites it */
    return fail(error, CASTMESH_STATUS_NO_DEVICE, "no RDMA device has port %u ACTIVE (found: %s; last: %s)",
                (unsigned)device->port, names, last);
  }
  return status;
}

int32_t rdma_engine_open_device(const struct rdma_verbs_ops* ops, const char* name, uint32_t port,
                                uint32_t gid_index, castmesh_rdma_device_v1** out, castmesh_error_v1* error) {
  castmesh_rdma_device_v1* device;
  int32_t status;
  if (out == NULL) return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "open_device: device must not be NULL");
  *out = NULL;
  if (port > 255) return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "port %u is not a valid port number", port);
  device = calloc(1, sizeof *device);
  if (device == NULL) return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of memory opening a device");
  device->ops = ops;
  device->port = (uint8_t)(port == 0 ? 1 : port);
  device->gid_index = gid_index;
  device->next_handle = 1;
  pthread_mutex_init(&device->mu, NULL);
  status = choose_device(device, name != NULL && name[0] != '\0' ? name : NULL, error);
  if (status == CASTMESH_STATUS_OK) status = prepare_device(device, error);
  if (status != CASTMESH_STATUS_OK) {
    rdma_engine_close_device(device);
    return status;
  }
  *out = device;
  return CASTMESH_STATUS_OK;
}

static void free_endpoint(const struct rdma_verbs_ops* ops, rdma_endpoint* endpoint) {
  if (endpoint->qp != NULL) ops->destroy_qp(endpoint->qp);
  if (endpoint->cq != NULL) ops->destroy_cq(endpoint->cq);
  free(endpoint->batches);
  free(endpoint);
}

void rdma_engine_close_device(castmesh_rdma_device_v1* device) {
  size_t i;
  if (device == NULL) return;
  /* Endpoints first: a QP may still reference the MRs' memory. */
  for (i = 0; i < device->endpoint_count; ++i) free_endpoint(device->ops, device->endpoints[i]);
  for (i = 0; i < device->mr_count; ++i) {
    device->ops->dereg_mr(device->mrs[i]->mr);
    free(device->mrs[i]);
  }
  free(device->endpoints);
  free(device->mrs);
  if (device->pd != NULL) device->ops->dealloc_pd(device->pd);
  if (device->context != NULL) device->ops->close_device(device->context);
  pthread_mutex_destroy(&device->mu);
  free(device);
}

/* ---- memory registrations ---- */

/* Appends `item` to a growable array of pointers; 0 or ENOMEM. */
static int append(void*** items, size_t* count, size_t* capacity, void* item) {
  if (*count == *capacity) {
    size_t grown = *capacity == 0 ? 8 : *capacity * 2;
    void** bigger = realloc(*items, grown * sizeof *bigger);
    if (bigger == NULL) return ENOMEM;
    *items = bigger;
    *capacity = grown;
  }
  (*items)[(*count)++] = item;
  return 0;
}

static void remove_at(void** items, size_t* count, size_t index) {
  items[index] = items[*count - 1];
  --*count;
}

static void fill_mr_info(const rdma_mr_entry* entry, castmesh_rdma_mr_info_v1* info) {
  info->handle = entry->handle;
  info->addr = entry->addr;
  info->length = entry->length;
  info->lkey = entry->mr->lkey;
  info->rkey = entry->mr->rkey;
  info->access = entry->access;
  info->refs = entry->refs;
}

static int verbs_access(uint32_t access) {
  int flags = 0;
  if (access & CASTMESH_RDMA_ACCESS_LOCAL_WRITE) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & CASTMESH_RDMA_ACCESS_REMOTE_READ) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & CASTMESH_RDMA_ACCESS_REMOTE_WRITE) flags |= IBV_ACCESS_REMOTE_WRITE;
  return flags;
}

static rdma_mr_entry* cached_mr(castmesh_rdma_device_v1* device, uint64_t addr, uint64_t length, uint32_t access) {
  size_t i;
  for (i = 0; i < device->mr_count; ++i) {
    rdma_mr_entry* entry = device->mrs[i];
    if (entry->addr <= addr && addr + length <= entry->addr + entry->length &&
        (entry->access & access) == access) {
      return entry;
    }
  }
  return NULL;
}

static int32_t register_locked(castmesh_rdma_device_v1* device, void* addr, uint64_t length, uint32_t access,
                               castmesh_rdma_mr_info_v1* info, castmesh_error_v1* error) {
  const uint64_t start = (uint64_t)(uintptr_t)addr;
  rdma_mr_entry* entry = cached_mr(device, start, length, access);
  struct ibv_mr* mr;
  if (entry != NULL) {
    ++entry->refs;
    fill_mr_info(entry, info);
    return CASTMESH_STATUS_OK;
  }
  entry = calloc(1, sizeof *entry);
  if (entry == NULL) return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of memory registering memory");
  errno = 0;
  mr = device->ops->reg_mr(device->pd, addr, (size_t)length, verbs_access(access));
  if (mr == NULL) {
    const int err = errno;
    free(entry);
    if (err == ENOMEM || err == EAGAIN) {
      return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED,
                  "ibv_reg_mr(%s, %llu bytes) failed: %s; the locked-memory limit (ulimit -l, systemd "
                  "LimitMEMLOCK) or the NIC's MR table is exhausted",
                  device->name, (unsigned long long)length, strerror(err));
    }
    return fail(error, err == EFAULT || err == EINVAL ? CASTMESH_STATUS_INVALID_ARGUMENT : CASTMESH_STATUS_INTERNAL,
                "ibv_reg_mr(%s, %p, %llu bytes) failed: %s", device->name, addr, (unsigned long long)length,
                strerror(err));
  }
  entry->handle = device->next_handle++;
  entry->mr = mr;
  entry->addr = start;
  entry->length = length;
  entry->access = access;
  entry->refs = 1;
  if (append((void***)&device->mrs, &device->mr_count, &device->mr_capacity, entry) != 0) {
    device->ops->dereg_mr(mr);
    free(entry);
    return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of memory registering memory");
  }
  fill_mr_info(entry, info);
  return CASTMESH_STATUS_OK;
}

int32_t rdma_engine_register_memory(castmesh_rdma_device_v1* device, void* addr, uint64_t length, uint32_t access,
                                    castmesh_rdma_mr_info_v1* info, castmesh_error_v1* error) {
  const uint32_t all = CASTMESH_RDMA_ACCESS_LOCAL_WRITE | CASTMESH_RDMA_ACCESS_REMOTE_READ |
                       CASTMESH_RDMA_ACCESS_REMOTE_WRITE;
  int32_t status;
  if (device == NULL || info == NULL || info->struct_size < sizeof *info) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "register_memory: device and info must be set, info->struct_size to sizeof(castmesh_rdma_mr_info_v1)");
  }
  if (addr == NULL || length == 0 || (uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "register_memory: [%p, +%llu) is not a memory range", addr,
                (unsigned long long)length);
  }
  if ((access & ~all) != 0) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "register_memory: unknown access bits 0x%x", access & ~all);
  }
  /* The verbs need local write with remote write. */
  if (access & CASTMESH_RDMA_ACCESS_REMOTE_WRITE) access |= CASTMESH_RDMA_ACCESS_LOCAL_WRITE;
  pthread_mutex_lock(&device->mu);
  status = register_locked(device, addr, length, access, info, error);
  pthread_mutex_unlock(&device->mu);
  return status;
}

int32_t rdma_engine_deregister_memory(castmesh_rdma_device_v1* device, uint64_t handle, castmesh_error_v1* error) {
  size_t i;
  int32_t status = CASTMESH_STATUS_OK;
  if (device == NULL) return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "deregister_memory: no device");
  pthread_mutex_lock(&device->mu);
  for (i = 0; i < device->mr_count && device->mrs[i]->handle != handle; ++i) {
  }
  if (i == device->mr_count) {
    status = fail(error, CASTMESH_STATUS_FAILED_PRECONDITION,
                  "deregister_memory: registration %llu is not live on %s (deregistered already, or never "
                  "registered here)",
                  (unsigned long long)handle, device->name);
  } else if (--device->mrs[i]->refs == 0) {
    rdma_mr_entry* entry = device->mrs[i];
    const int rc = device->ops->dereg_mr(entry->mr);
    remove_at((void**)device->mrs, &device->mr_count, i);
    free(entry);
    if (rc != 0) {
      /* The verbs object may survive (a QP still uses it); the handle is gone either way. */
      status = fail(error, CASTMESH_STATUS_INTERNAL, "ibv_dereg_mr(%s) failed: %s", device->name, strerror(rc));
    }
  }
  pthread_mutex_unlock(&device->mu);
  return status;
}

/* ---- endpoints ---- */

static rdma_endpoint* find_endpoint(castmesh_rdma_device_v1* device, uint64_t handle, size_t* index) {
  size_t i;
  for (i = 0; i < device->endpoint_count; ++i) {
    if (device->endpoints[i]->handle == handle) {
      if (index != NULL) *index = i;
      return device->endpoints[i];
    }
  }
  return NULL;
}

static int32_t no_endpoint(castmesh_rdma_device_v1* device, uint64_t handle, const char* call,
                           castmesh_error_v1* error) {
  return fail(error, CASTMESH_STATUS_FAILED_PRECONDITION,
              "%s: endpoint %llu is not live on %s (destroyed already, or created on another device)", call,
              (unsigned long long)handle, device->name);
}

static void put_u16(uint8_t* out, uint16_t value) {
  out[0] = (uint8_t)(value >> 8);
  out[1] = (uint8_t)value;
}
static void put_u32(uint8_t* out, uint32_t value) {
  out[0] = (uint8_t)(value >> 24);
  out[1] = (uint8_t)(value >> 16);
  out[2] = (uint8_t)(value >> 8);
  out[3] = (uint8_t)value;
}
static uint16_t get_u16(const uint8_t* in) { return (uint16_t)((in[0] << 8) | in[1]); }
static uint32_t get_u32(const uint8_t* in) {
  return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) | in[3];
}

static void write_blob(const castmesh_rdma_device_v1* device, const rdma_endpoint* endpoint, uint8_t* blob) {
  memset(blob, 0, CASTMESH_RDMA_ENDPOINT_BLOB_SIZE);
  memcpy(blob, kBlobMagic, sizeof kBlobMagic);
  put_u16(blob + 4, kBlobVersion);
  blob[6] = (uint8_t)device->port_attr.active_mtu;
  blob[7] = device->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? 2 : 1;
  put_u16(blob + 8, device->port_attr.lid);
  put_u32(blob + 12, endpoint->qp->qp_num);
  put_u32(blob + 16, endpoint->psn);
  memcpy(blob + 20, device->gid.raw, 16);
}

/* A 24-bit starting PSN that differs between QPs and between runs, so
 * packets of an earlier connection with the same QP number are rejected.
 * (time() rather than clock_gettime keeps the plugin's glibc floor at 2.2.5,
 * its manylinux_2_5 wheel tag.) */
static uint32_t first_psn(uint32_t qp_num, const void* endpoint) {
  const uint64_t mix = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)(uintptr_t)endpoint ^ qp_num * 40503u;
  return (uint32_t)(mix ^ (mix >> 24) ^ (mix >> 48)) & 0xFFFFFFu;
}

static int32_t create_locked(castmesh_rdma_device_v1* device, uint32_t depth, uint64_t* handle, uint8_t* blob,
                             castmesh_error_v1* error) {
  const struct rdma_verbs_ops* ops = device->ops;
  struct ibv_qp_init_attr init;
  rdma_endpoint* endpoint = calloc(1, sizeof *endpoint);
  if (endpoint == NULL || (endpoint->batches = calloc(depth, sizeof *endpoint->batches)) == NULL) {
    free(endpoint);
    return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of memory creating an endpoint");
  }
  endpoint->sq_depth = depth;
  /* Every op may complete (errors complete unsignalled ops too). */
  endpoint->cq = ops->create_cq(device->context, (int)depth, NULL, NULL, 0);
  if (endpoint->cq == NULL) {
    const int err = errno;
    free_endpoint(ops, endpoint);
    return fail(error, err == ENOMEM ? CASTMESH_STATUS_RESOURCE_EXHAUSTED : CASTMESH_STATUS_INTERNAL,
                "ibv_create_cq(%s, %u entries) failed: %s", device->name, depth, strerror(err));
  }
  memset(&init, 0, sizeof init);
  init.send_cq = endpoint->cq;
  init.recv_cq = endpoint->cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0; /* selective signalling */
  init.cap.max_send_wr = depth;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  endpoint->qp = ops->create_qp(device->pd, &init);
  if (endpoint->qp == NULL) {
    const int err = errno;
    free_endpoint(ops, endpoint);
    return fail(error, err == ENOMEM ? CASTMESH_STATUS_RESOURCE_EXHAUSTED : CASTMESH_STATUS_INTERNAL,
                "ibv_create_qp(%s, RC, %u send slots) failed: %s", device->name, depth, strerror(err));
  }
  endpoint->psn = first_psn(endpoint->qp->qp_num, endpoint);
  endpoint->handle = device->next_handle++;
  endpoint->state = kCreated;
  if (append((void***)&device->endpoints, &device->endpoint_count, &device->endpoint_capacity, endpoint) != 0) {
    free_endpoint(ops, endpoint);
    return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "out of memory creating an endpoint");
  }
  write_blob(device, endpoint, blob);
  *handle = endpoint->handle;
  return CASTMESH_STATUS_OK;
}

int32_t rdma_engine_create_endpoint(castmesh_rdma_device_v1* device, uint32_t send_queue_depth, uint64_t* handle,
                                    uint8_t* blob, castmesh_error_v1* error) {
  int32_t status;
  uint32_t depth = send_queue_depth == 0 ? kDefaultSendQueueDepth : send_queue_depth;
  if (device == NULL || handle == NULL || blob == NULL) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "create_endpoint: device, endpoint and blob must be set");
  }
  if (depth > (uint32_t)device->device_attr.max_qp_wr || depth > (uint32_t)device->device_attr.max_cqe) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "create_endpoint: send queue depth %u exceeds %s's limits (max_qp_wr %d, max_cqe %d)", depth,
                device->name, device->device_attr.max_qp_wr, device->device_attr.max_cqe);
  }
  pthread_mutex_lock(&device->mu);
  status = create_locked(device, depth, handle, blob, error);
  pthread_mutex_unlock(&device->mu);
  return status;
}

/* The peer's half of the connection, parsed from its blob. */
typedef struct peer_info {
  uint8_t mtu;
  uint8_t link_layer;
  uint16_t lid;
  uint32_t qp_num;
  uint32_t psn;
  union ibv_gid gid;
} peer_info;

static int32_t parse_blob(const castmesh_rdma_device_v1* device, const uint8_t* blob, size_t size, peer_info* peer,
                          castmesh_error_v1* error) {
  const uint8_t local_link = device->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? 2 : 1;
  uint16_t version;
  if (blob == NULL || size < CASTMESH_RDMA_ENDPOINT_BLOB_SIZE) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's connection blob is %zu bytes, needs %d (truncated message?)",
                blob == NULL ? (size_t)0 : size, CASTMESH_RDMA_ENDPOINT_BLOB_SIZE);
  }
  if (memcmp(blob, kBlobMagic, sizeof kBlobMagic) != 0) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's blob is not a castmesh RDMA endpoint blob (bad magic)");
  }
  version = get_u16(blob + 4);
  if (version != kBlobVersion) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's blob has version %u, this backend speaks %d; use the same castmesh "
                "version on both hosts",
                (unsigned)version, kBlobVersion);
  }
  peer->mtu = blob[6];
  peer->link_layer = blob[7];
  peer->lid = get_u16(blob + 8);
  peer->qp_num = get_u32(blob + 12);
  peer->psn = get_u32(blob + 16);
  memcpy(peer->gid.raw, blob + 20, 16);
  if (peer->mtu < IBV_MTU_256 || peer->mtu > IBV_MTU_4096) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "connect_endpoint: the peer's MTU code %u is not 1..5",
                (unsigned)peer->mtu);
  }
  if (peer->qp_num == 0 || peer->qp_num > 0xFFFFFFu || peer->psn > 0xFFFFFFu) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's QP number %u or PSN %u is not a 24-bit value (QP number 0 is invalid)",
                peer->qp_num, peer->psn);
  }
  if (peer->link_layer != 1 && peer->link_layer != 2) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "connect_endpoint: the peer's link layer %u is not 1 or 2",
                (unsigned)peer->link_layer);
  }
  if (peer->link_layer != local_link) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's port is %s, this one (%s) is %s: they cannot connect",
                peer->link_layer == 2 ? "Ethernet (RoCE)" : "InfiniBand", device->name,
                local_link == 2 ? "Ethernet (RoCE)" : "InfiniBand");
  }
  if (peer->link_layer == 1 && peer->lid == 0) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                "connect_endpoint: the peer's InfiniBand port has LID 0 (is a subnet manager running?)");
  }
  return CASTMESH_STATUS_OK;
}

static int clamp_atomic(int value) { return value < 1 ? 1 : value > 255 ? 255 : value; }

/* One ibv_modify_qp step; on failure the endpoint is failed with the reason. */
static int32_t transition(castmesh_rdma_device_v1* device, rdma_endpoint* endpoint, struct ibv_qp_attr* attr,
                          int mask, const char* step, castmesh_error_v1* error) {
  const int rc = device->ops->modify_qp(endpoint->qp, attr, mask);
  if (rc == 0) return CASTMESH_STATUS_OK;
  endpoint->state = kFailed;
  snprintf(endpoint->failure, sizeof endpoint->failure, "connecting failed at %s: ibv_modify_qp: %s", step,
           strerror(rc));
  return fail(error, CASTMESH_STATUS_INTERNAL,
              "connect_endpoint(%s): %s failed: ibv_modify_qp: %s (destroy the endpoint and create a new one)",
              device->name, step, strerror(rc));
}

static int32_t connect_qp(castmesh_rdma_device_v1* device, rdma_endpoint* endpoint, const peer_info* peer,
                          castmesh_error_v1* error) {
  struct ibv_qp_attr attr;
  int32_t status;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = device->port;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  status = transition(device, endpoint, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "RESET->INIT", error);
  if (status != CASTMESH_STATUS_OK) return status;

  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = peer->mtu < (uint8_t)device->port_attr.active_mtu ? (enum ibv_mtu)peer->mtu
                                                                       : device->port_attr.active_mtu;
  attr.dest_qp_num = peer->qp_num;
  attr.rq_psn = peer->psn;
  attr.max_dest_rd_atomic = (uint8_t)clamp_atomic(device->device_attr.max_qp_rd_atom);
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.dlid = peer->lid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.port_num = device->port;
  if (peer->link_layer == 2 || peer->lid == 0) {
    /* RoCE (and routed IB) address the peer by GID. */
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = peer->gid;
    attr.ah_attr.grh.sgid_index = (uint8_t)device->gid_index;
    attr.ah_attr.grh.hop_limit = kHopLimit;
  }
  status = transition(device, endpoint, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                      "INIT->RTR", error);
  if (status != CASTMESH_STATUS_OK) return status;

  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kAckTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetry;
  attr.sq_psn = endpoint->psn;
  attr.max_rd_atomic = (uint8_t)clamp_atomic(device->device_attr.max_qp_init_rd_atom);
  status = transition(device, endpoint, &attr,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC,
                      "RTR->RTS", error);
  if (status != CASTMESH_STATUS_OK) return status;
  endpoint->state = kConnected;
  return CASTMESH_STATUS_OK;
}

static int32_t not_usable(castmesh_rdma_device_v1* device, const rdma_endpoint* endpoint, const char* call,
                          castmesh_error_v1* error) {
  if (endpoint->state == kFailed) {
    return fail(error, CASTMESH_STATUS_FAILED_PRECONDITION,
                "%s: endpoint %llu on %s has failed (%s); destroy it and connect a new one", call,
                (unsigned long long)endpoint->handle, device->name, endpoint->failure);
  }
  if (endpoint->state == kConnected) {
    return fail(error, CASTMESH_STATUS_FAILED_PRECONDITION, "%s: endpoint %llu on %s is already connected", call,
                (unsigned long long)endpoint->handle, device->name);
  }
  return fail(error, CASTMESH_STATUS_FAILED_PRECONDITION,
              "%s: endpoint %llu on %s is not connected yet; call connect_endpoint with the peer's blob first", call,
              (unsigned long long)endpoint->handle, device->name);
}

int32_t rdma_engine_connect_endpoint(castmesh_rdma_device_v1* device, uint64_t handle, const uint8_t* peer_blob,
                                     size_t peer_blob_size, castmesh_error_v1* error) {
  rdma_endpoint* endpoint;
  peer_info peer;
  int32_t status;
  memset(&peer, 0, sizeof peer);
  if (device == NULL) return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "connect_endpoint: no device");
  pthread_mutex_lock(&device->mu);
  endpoint = find_endpoint(device, handle, NULL);
  if (endpoint == NULL) {
    status = no_endpoint(device, handle, "connect_endpoint", error);
  } else if (endpoint->state != kCreated) {
    status = not_usable(device, endpoint, "connect_endpoint", error);
  } else {
    status = parse_blob(device, peer_blob, peer_blob_size, &peer, error);
    if (status == CASTMESH_STATUS_OK) status = connect_qp(device, endpoint, &peer, error);
  }
  pthread_mutex_unlock(&device->mu);
  return status;
}

int32_t rdma_engine_destroy_endpoint(castmesh_rdma_device_v1* device, uint64_t handle, castmesh_error_v1* error) {
  rdma_endpoint* endpoint;
  size_t index = 0;
  int32_t status = CASTMESH_STATUS_OK;
  if (device == NULL) return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "destroy_endpoint: no device");
  pthread_mutex_lock(&device->mu);
  endpoint = find_endpoint(device, handle, &index);
  if (endpoint == NULL) {
    status = no_endpoint(device, handle, "destroy_endpoint", error);
  } else {
    remove_at((void**)device->endpoints, &device->endpoint_count, index);
    free_endpoint(device->ops, endpoint);
  }
  pthread_mutex_unlock(&device->mu);
  return status;
}

/* ---- posting ---- */

static int32_t check_ops(const castmesh_rdma_device_v1* device, const castmesh_rdma_op_v1* ops, uint32_t count,
                         castmesh_error_v1* error) {
  uint32_t i;
  for (i = 0; i < count; ++i) {
    const castmesh_rdma_op_v1* op = &ops[i];
    if (op->opcode != CASTMESH_RDMA_OP_READ && op->opcode != CASTMESH_RDMA_OP_WRITE) {
      return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "post: op %u has opcode %u, not READ (1) or WRITE (2)", i,
                  op->opcode);
    }
    if ((op->flags & ~(uint32_t)CASTMESH_RDMA_OP_SIGNALED) != 0) {
      return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "post: op %u has unknown flags 0x%x", i, op->flags);
    }
    if (op->length > device->port_attr.max_msg_sz || op->length > UINT32_MAX) {
      return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                  "post: op %u moves %llu bytes, port %u of %s carries at most %u per op; split it", i,
                  (unsigned long long)op->length, (unsigned)device->port, device->name, device->port_attr.max_msg_sz);
    }
  }
  return CASTMESH_STATUS_OK;
}

/* Records the slots of the ops that reached the NIC (see rdma_endpoint). */
static void account_posted(rdma_endpoint* endpoint, const struct ibv_send_wr* wrs, uint32_t posted) {
  uint32_t i;
  for (i = 0; i < posted; ++i) {
    ++endpoint->outstanding;
    ++endpoint->unsignaled_run;
    if (wrs[i].send_flags & IBV_SEND_SIGNALED) {
      endpoint->batches[(endpoint->batch_head + endpoint->batch_count) % endpoint->sq_depth] =
          endpoint->unsignaled_run;
      ++endpoint->batch_count;
      endpoint->unsignaled_run = 0;
    }
  }
}

static int32_t post_locked(castmesh_rdma_device_v1* device, rdma_endpoint* endpoint, const castmesh_rdma_op_v1* ops,
                           uint32_t count, uint32_t* posted, castmesh_error_v1* error) {
  struct ibv_send_wr* wrs;
  struct ibv_sge* sges;
  struct ibv_send_wr* bad = NULL;
  uint32_t i;
  int rc;
  if (endpoint->outstanding + count > endpoint->sq_depth) {
    return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED,
                "post: send queue full: %u of %u slots in use, %u more asked for; poll completions and retry",
                endpoint->outstanding, endpoint->sq_depth, count);
  }
  wrs = calloc(count, sizeof *wrs);
  sges = calloc(count, sizeof *sges);
  if (wrs == NULL || sges == NULL) {
    free(wrs);
    free(sges);
    return fail(error, CASTMESH_STATUS_RESOURCE_EXHAUSTED, "post: out of memory for %u ops", count);
  }
  for (i = 0; i < count; ++i) {
    sges[i].addr = ops[i].local_addr;
    sges[i].length = (uint32_t)ops[i].length;
    sges[i].lkey = ops[i].lkey;
    wrs[i].wr_id = ops[i].wr_id;
    wrs[i].next = i + 1 < count ? &wrs[i + 1] : NULL;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].opcode = ops[i].opcode == CASTMESH_RDMA_OP_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    /* The last op always signals, so a list completes with one completion. */
    if ((ops[i].flags & CASTMESH_RDMA_OP_SIGNALED) || i + 1 == count) wrs[i].send_flags = IBV_SEND_SIGNALED;
    wrs[i].wr.rdma.remote_addr = ops[i].remote_addr;
    wrs[i].wr.rdma.rkey = ops[i].rkey;
  }
  rc = device->ops->post_send(endpoint->qp, wrs, &bad);
  *posted = rc == 0 ? count : bad != NULL ? (uint32_t)(bad - wrs) : 0;
  account_posted(endpoint, wrs, *posted);
  free(wrs);
  free(sges);
  if (rc == 0) return CASTMESH_STATUS_OK;
  if (*posted > 0) {
    /* The ops that went out end with an unsignalled one: their slots would
     * never be retired, so the endpoint cannot be trusted any more. */
    endpoint->state = kFailed;
    snprintf(endpoint->failure, sizeof endpoint->failure, "ibv_post_send refused op %u of a list: %s", *posted,
             strerror(rc));
    return fail(error, CASTMESH_STATUS_INTERNAL,
                "post: ibv_post_send took %u of %u ops, then failed: %s; the endpoint has failed", *posted, count,
                strerror(rc));
  }
  return fail(error, rc == ENOMEM ? CASTMESH_STATUS_RESOURCE_EXHAUSTED
              : rc == EINVAL      ? CASTMESH_STATUS_INVALID_ARGUMENT
                                  : CASTMESH_STATUS_INTERNAL,
              "post: ibv_post_send(%s) failed: %s%s", device->name, strerror(rc),
              rc == ENOMEM ? " (the NIC's send queue is full; poll completions and retry)" : "");
}

int32_t rdma_engine_post(castmesh_rdma_device_v1* device, uint64_t handle, const castmesh_rdma_op_v1* ops,
                         uint32_t count, uint32_t* posted, castmesh_error_v1* error) {
  rdma_endpoint* endpoint;
  int32_t status;
  uint32_t ignored = 0;
  if (posted == NULL) posted = &ignored;
  *posted = 0;
  if (device == NULL || (ops == NULL && count > 0)) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "post: device and ops must be set");
  }
  pthread_mutex_lock(&device->mu);
  endpoint = find_endpoint(device, handle, NULL);
  if (endpoint == NULL) {
    status = no_endpoint(device, handle, "post", error);
  } else if (endpoint->state != kConnected) {
    status = not_usable(device, endpoint, "post", error);
  } else if (count > endpoint->sq_depth) {
    status = fail(error, CASTMESH_STATUS_INVALID_ARGUMENT,
                  "post: %u ops can never fit the endpoint's send queue of %u; post them in smaller lists", count,
                  endpoint->sq_depth);
  } else {
    status = check_ops(device, ops, count, error);
    if (status == CASTMESH_STATUS_OK && count > 0) status = post_locked(device, endpoint, ops, count, posted, error);
  }
  pthread_mutex_unlock(&device->mu);
  return status;
}

/* ---- completions ---- */

typedef struct wc_meaning {
  int32_t status;
  const char* message;
} wc_meaning;

static wc_meaning wc_meaning_of(int wc_status) {
  wc_meaning m = {CASTMESH_STATUS_INTERNAL, "unknown completion status (a newer NIC driver?)"};
  switch ((enum ibv_wc_status)wc_status) {
    case IBV_WC_SUCCESS: m.status = CASTMESH_STATUS_OK; m.message = "ok"; break;
    case IBV_WC_LOC_LEN_ERR:
      m.status = CASTMESH_STATUS_INVALID_ARGUMENT;
      m.message = "local length error: the op's length does not fit the local buffer or the QP's limits";
      break;
    case IBV_WC_LOC_QP_OP_ERR:
      m.message = "local QP operation error: the request is inconsistent with the queue pair (backend bug?)";
      break;
    case IBV_WC_LOC_EEC_OP_ERR: m.message = "local EE context operation error (reliable datagram, unused)"; break;
    case IBV_WC_LOC_PROT_ERR:
      m.status = CASTMESH_STATUS_INVALID_ARGUMENT;
      m.message = "local protection error: the local address/lkey is not a registration of this device covering "
                  "the range with the needed access (a READ's destination needs local write)";
      break;
    case IBV_WC_WR_FLUSH_ERR:
      m.status = CASTMESH_STATUS_ABORTED;
      m.message = "flushed: an earlier op on this endpoint failed, so this one did not run";
      break;
    case IBV_WC_MW_BIND_ERR: m.message = "memory window bind error (memory windows are unused)"; break;
    case IBV_WC_BAD_RESP_ERR: m.message = "bad response: the peer's NIC answered with an unexpected opcode"; break;
    case IBV_WC_LOC_ACCESS_ERR:
      m.status = CASTMESH_STATUS_INVALID_ARGUMENT;
      m.message = "local access error: the local registration does not allow writing the returned data";
      break;
    case IBV_WC_REM_INV_REQ_ERR:
      m.status = CASTMESH_STATUS_INVALID_ARGUMENT;
      m.message = "remote invalid request: the peer rejected the op (length over its limit, or an op its QP "
                  "does not accept)";
      break;
    case IBV_WC_REM_ACCESS_ERR:
      m.status = CASTMESH_STATUS_PERMISSION_DENIED;
      m.message = "remote access error: the rkey/range is not registered for this access on the owner";
      break;
    case IBV_WC_REM_OP_ERR: m.message = "remote operation error: the peer's NIC could not complete the op"; break;
    case IBV_WC_RETRY_EXC_ERR:
      m.status = CASTMESH_STATUS_UNAVAILABLE;
      m.message = "transport retries exceeded: the peer did not answer (process or host gone, QP destroyed, or "
                  "no route)";
      break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      m.status = CASTMESH_STATUS_UNAVAILABLE;
      m.message = "receiver-not-ready retries exceeded: the peer's QP had no receive posted";
      break;
    case IBV_WC_LOC_RDD_VIOL_ERR: m.message = "local RDD violation (reliable datagram, unused)"; break;
    case IBV_WC_REM_INV_RD_REQ_ERR: m.message = "remote invalid RD request (reliable datagram, unused)"; break;
    case IBV_WC_REM_ABORT_ERR:
      m.status = CASTMESH_STATUS_ABORTED;
      m.message = "remote abort: the peer aborted the op";
      break;
    case IBV_WC_INV_EECN_ERR: m.message = "invalid EE context number (reliable datagram, unused)"; break;
    case IBV_WC_INV_EEC_STATE_ERR: m.message = "invalid EE context state (reliable datagram, unused)"; break;
    case IBV_WC_FATAL_ERR: m.message = "fatal NIC error: the device needs a reset"; break;
    case IBV_WC_RESP_TIMEOUT_ERR:
      m.status = CASTMESH_STATUS_UNAVAILABLE;
      m.message = "response timeout: the peer did not answer in time";
      break;
    case IBV_WC_GENERAL_ERR: m.message = "general error reported by the NIC"; break;
    case IBV_WC_TM_ERR: m.message = "tag matching error (tag matching is unused)"; break;
    case IBV_WC_TM_RNDV_INCOMPLETE: m.message = "tag matching rendezvous incomplete (tag matching is unused)"; break;
  }
  return m;
}

int32_t rdma_engine_wc_status(int wc_status, const char** message) {
  const wc_meaning m = wc_meaning_of(wc_status);
  if (message != NULL) *message = m.message;
  return m.status;
}

static void convert_completion(castmesh_rdma_device_v1* device, rdma_endpoint* endpoint, const struct ibv_wc* wc,
                               castmesh_rdma_completion_v1* out) {
  const wc_meaning m = wc_meaning_of((int)wc->status);
  out->wr_id = wc->wr_id;
  out->status = m.status;
  out->wc_status = (int32_t)wc->status;
  out->vendor_err = wc->vendor_err;
  out->opcode = 0;
  if (wc->status == IBV_WC_SUCCESS) {
    out->opcode = wc->opcode == IBV_WC_RDMA_READ ? CASTMESH_RDMA_OP_READ
                  : wc->opcode == IBV_WC_RDMA_WRITE ? CASTMESH_RDMA_OP_WRITE
                                                    : 0;
    snprintf(out->message, sizeof out->message, "ok");
    if (endpoint->batch_count > 0) {
      const uint32_t retired = endpoint->batches[endpoint->batch_head];
      endpoint->batch_head = (endpoint->batch_head + 1) % endpoint->sq_depth;
      --endpoint->batch_count;
      endpoint->outstanding -= retired <= endpoint->outstanding ? retired : endpoint->outstanding;
    }
    return;
  }
  snprintf(out->message, sizeof out->message, "%s (ibv_wc_status %d, vendor error 0x%x)", m.message, (int)wc->status,
           (unsigned)wc->vendor_err);
  if (endpoint->state != kFailed) {
    endpoint->state = kFailed;
    snprintf(endpoint->failure, sizeof endpoint->failure, "op %llu: %s on %s", (unsigned long long)wc->wr_id,
             m.message, device->name);
  }
}

static int32_t poll_locked(castmesh_rdma_device_v1* device, rdma_endpoint* endpoint, castmesh_rdma_completion_v1* out,
                           uint32_t capacity, uint32_t* count, castmesh_error_v1* error) {
  struct ibv_wc wcs[kPollChunk];
  while (*count < capacity) {
    const uint32_t want = capacity - *count < kPollChunk ? capacity - *count : kPollChunk;
    int i;
    const int got = device->ops->poll_cq(endpoint->cq, (int)want, wcs);
    if (got < 0) {
      return fail(error, CASTMESH_STATUS_INTERNAL, "poll: ibv_poll_cq(%s) failed (%d): the completion queue is broken",
                  device->name, got);
    }
    for (i = 0; i < got; ++i) convert_completion(device, endpoint, &wcs[i], &out[(*count)++]);
    if ((uint32_t)got < want) break;
  }
  return CASTMESH_STATUS_OK;
}

int32_t rdma_engine_poll(castmesh_rdma_device_v1* device, uint64_t handle, castmesh_rdma_completion_v1* completions,
                         uint32_t capacity, uint32_t* count, castmesh_error_v1* error) {
  rdma_endpoint* endpoint;
  int32_t status;
  if (count == NULL || device == NULL || (completions == NULL && capacity > 0)) {
    return fail(error, CASTMESH_STATUS_INVALID_ARGUMENT, "poll: device, completions and count must be set");
  }
  *count = 0;
  pthread_mutex_lock(&device->mu);
  endpoint = find_endpoint(device, handle, NULL);
  status = endpoint == NULL ? no_endpoint(device, handle, "poll", error)
                            : poll_locked(device, endpoint, completions, capacity, count, error);
  pthread_mutex_unlock(&device->mu);
  return status;
}

int64_t rdma_engine_outstanding(castmesh_rdma_device_v1* device, uint64_t handle) {
  rdma_endpoint* endpoint;
  int64_t outstanding = -1;
  pthread_mutex_lock(&device->mu);
  endpoint = find_endpoint(device, handle, NULL);
  if (endpoint != NULL) outstanding = endpoint->outstanding;
  pthread_mutex_unlock(&device->mu);
  return outstanding;
}
