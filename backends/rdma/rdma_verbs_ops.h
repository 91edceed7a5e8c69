/* The libibverbs calls the rdma backend makes, as a table of function
 * pointers, so the backend's logic can run against the real library (the
 * shipped plugin, rdma_verbs_real.c) or against a fake provider (the unit
 * tests, tests/backends/rdma/fake_verbs.cc) on machines without a NIC.
 *
 * Every entry has the contract of the libibverbs function of the same name
 * (ibv_<entry>): pointer-returning entries set errno on failure, int-returning
 * ones return 0 or an errno value (ibv_poll_cq: a count, negative on error). */
#ifndef CASTMESH_BACKENDS_RDMA_VERBS_OPS_H_
#define CASTMESH_BACKENDS_RDMA_VERBS_OPS_H_

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rdma_verbs_ops {
  struct ibv_device** (*get_device_list)(int* num_devices);
  void (*free_device_list)(struct ibv_device** list);
  const char* (*get_device_name)(struct ibv_device* device);
  struct ibv_context* (*open_device)(struct ibv_device* device);
  int (*close_device)(struct ibv_context* context);
  int (*query_device)(struct ibv_context* context, struct ibv_device_attr* attr);
  int (*query_port)(struct ibv_context* context, uint8_t port, struct ibv_port_attr* attr);
  int (*query_gid)(struct ibv_context* context, uint8_t port, int index, union ibv_gid* gid);
  struct ibv_pd* (*alloc_pd)(struct ibv_context* context);
  int (*dealloc_pd)(struct ibv_pd* pd);
  struct ibv_mr* (*reg_mr)(struct ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(struct ibv_mr* mr);
  struct ibv_cq* (*create_cq)(struct ibv_context* context, int cqe, void* cq_context,
                              struct ibv_comp_channel* channel, int comp_vector);
  int (*destroy_cq)(struct ibv_cq* cq);
  struct ibv_qp* (*create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  int (*destroy_qp)(struct ibv_qp* qp);
  int (*modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask);
  int (*post_send)(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr);
  int (*poll_cq)(struct ibv_cq* cq, int num_entries, struct ibv_wc* wc);
};

/* The real libibverbs (defined in rdma_verbs_real.c; only the plugin and the
 * RealVerbs tests link it). */
const struct rdma_verbs_ops* rdma_real_verbs(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CASTMESH_BACKENDS_RDMA_VERBS_OPS_H_ */
