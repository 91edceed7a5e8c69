/* rdma_verbs_ops filled with libibverbs. Several verbs are static inline
 * functions or macros in verbs.h (they dispatch through the provider's
 * context ops), so each gets a small real function here. */
#include "rdma_verbs_ops.h"

static const char* real_get_device_name(struct ibv_device* device) { return ibv_get_device_name(device); }

static int real_query_port(struct ibv_context* context, uint8_t port, struct ibv_port_attr* attr) {
  return ibv_query_port(context, port, attr);
}

static struct ibv_mr* real_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr(pd, addr, length, access);
}

static int real_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr) {
  return ibv_post_send(qp, wr, bad_wr);
}

static int real_poll_cq(struct ibv_cq* cq, int num_entries, struct ibv_wc* wc) {
  return ibv_poll_cq(cq, num_entries, wc);
}

static const struct rdma_verbs_ops kRealVerbs = {
    ibv_get_device_list, ibv_free_device_list, real_get_device_name, ibv_open_device, ibv_close_device,
    ibv_query_device,    real_query_port,      ibv_query_gid,        ibv_alloc_pd,    ibv_dealloc_pd,
    real_reg_mr,         ibv_dereg_mr,         ibv_create_cq,        ibv_destroy_cq,  ibv_create_qp,
    ibv_destroy_qp,      ibv_modify_qp,        real_post_send,       real_poll_cq,
};

const struct rdma_verbs_ops* rdma_real_verbs(void) { return &kRealVerbs; }
