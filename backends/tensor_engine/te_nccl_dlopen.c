/* Binds te_nccl_ops to a collective library found with dlopen, so the plugin
 * never links it: the CUDA build opens NCCL (pip's nvidia-nccl-cu12/-cu13 or
 * the system's libnccl.so.2), the HIP build RCCL (librccl.so.1), which has
 * NCCL's API and symbol names. It is picked up at first use, and a machine
 * without it still loads the plugin.
 *
 * The entries are the library's own functions, except comm_init_rank: NCCL
 * passes ncclUniqueId by value, so a small function rebuilds it from the
 * bytes. The other signatures differ from NCCL's only in spelling (enums are
 * int-sized, handles are pointers), which is the same calling convention. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "te_ops.h"

typedef struct te_nccl_unique_id {
  char internal[128];
} te_nccl_unique_id;
typedef int (*te_nccl_init_rank_fn)(void** comm, int nranks, te_nccl_unique_id id, int rank);

/* Set once per process by the first successful te_nccl_dlopen (under the
 * engine's lock); later loads of the same library yield the same symbol. */
static te_nccl_init_rank_fn g_init_rank;

static int by_value_comm_init_rank(void** comm, int nranks, const void* id, int rank) {
  te_nccl_unique_id value;
  memcpy(value.internal, id, sizeof value.internal);
  return g_init_rank(comm, nranks, value, rank);
}

/* dlsym into a function pointer of any type (POSIX guarantees the cast). */
#define TE_BIND(field, symbol)                                  \
  do {                                                          \
    void* found = dlsym(handle, symbol);                        \
    if (found == NULL) {                                        \
      snprintf(why, why_size, "%s has no symbol %s", library, symbol); \
      return -1;                                                \
    }                                                           \
    memcpy(&ops->field, &found, sizeof found);                  \
  } while (0)

int te_nccl_dlopen(const char* library, struct te_nccl_ops* ops, char* why, size_t why_size) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  void* init_rank = NULL;
  void* last_error = NULL;
  if (handle == NULL) {
    /* dlerror usually starts with the name; say it when it does not. */
    const char* text = dlerror();
    if (text == NULL) text = "dlopen failed";
    if (strstr(text, library) != NULL) {
      snprintf(why, why_size, "%s", text);
    } else {
      snprintf(why, why_size, "%s: %s", library, text);
    }
    return -1;
  }
  memset(ops, 0, sizeof *ops);
  TE_BIND(get_version, "ncclGetVersion");
  TE_BIND(get_unique_id, "ncclGetUniqueId");
  TE_BIND(comm_destroy, "ncclCommDestroy");
  TE_BIND(comm_abort, "ncclCommAbort");
  TE_BIND(comm_get_async_error, "ncclCommGetAsyncError");
  TE_BIND(all_reduce, "ncclAllReduce");
  TE_BIND(broadcast, "ncclBroadcast");
  TE_BIND(all_gather, "ncclAllGather");
  TE_BIND(reduce_scatter, "ncclReduceScatter");
  TE_BIND(send, "ncclSend");
  TE_BIND(recv, "ncclRecv");
  TE_BIND(group_start, "ncclGroupStart");
  TE_BIND(group_end, "ncclGroupEnd");
  TE_BIND(get_error_string, "ncclGetErrorString");
  init_rank = dlsym(handle, "ncclCommInitRank");
  if (init_rank == NULL) {
    snprintf(why, why_size, "%s has no symbol ncclCommInitRank", library);
    return -1;
  }
  memcpy(&g_init_rank, &init_rank, sizeof init_rank);
  ops->comm_init_rank = &by_value_comm_init_rank;
  last_error = dlsym(handle, "ncclGetLastError"); /* NCCL >= 2.13 */
  if (last_error != NULL) memcpy(&ops->get_last_error, &last_error, sizeof last_error);
  return 0;
}
