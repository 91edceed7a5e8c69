// A FAKE libibverbs provider for the rdma backend's unit tests: in-process
// devices, protection domains, memory registrations, RC queue pairs and
// completion queues behind a rdma_verbs_ops table. A READ or WRITE posted on
// a connected fake QP really copies bytes between registered host ranges of
// the two QPs, after checking keys, ranges and access the way a NIC does, and
// produces the matching completion (errors included). Failures can be
// injected per call. Single process, single test at a time: the state is
// global and reset() starts over; calls are serialised by one mutex.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rdma_verbs_ops.h"

namespace castmesh::fake_verbs {

// One fake NIC with one port.
struct DeviceSpec {
  std::string name;
  uint16_t lid = 1;
  ibv_port_state port_state = IBV_PORT_ACTIVE;
  ibv_mtu mtu = IBV_MTU_4096;
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  int max_qp_wr = 256;
  int max_qp_rd_atom = 16;
};

// Calls whose next invocation can be made to fail.
enum class Call {
  kGetDeviceList,
  kOpenDevice,
  kAllocPd,
  kRegMr,
  kCreateCq,
  kCreateQp,
  kModifyQpToInit,
  kModifyQpToRtr,
  kModifyQpToRts,
  kPostSend,
};

// What the fake QP was configured with by modify_qp, for assertions.
struct QpSnapshot {
  bool exists = false;
  ibv_qp_state state = IBV_QPS_RESET;
  uint32_t dest_qp_num = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  ibv_mtu path_mtu = IBV_MTU_256;
  uint16_t dlid = 0;
  bool is_global = false;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  int access_flags = 0;
  int max_send_wr = 0;
  bool sq_sig_all = true;
};

// Live fake objects, to check that everything created was destroyed.
struct LiveObjects {
  int contexts = 0;
  int pds = 0;
  int mrs = 0;
  int cqs = 0;
  int qps = 0;
};

// The ops table that calls into the fake.
const rdma_verbs_ops* ops();
// Forgets every object and injection and installs these devices.
void reset(std::vector<DeviceSpec> devices);
// The next call of `call` fails with `error` (an errno value); for
// kGetDeviceList with ENOSYS/other errno, or 0 meaning "an empty list".
void fail_next(Call call, int error);
// The next post_send takes the first `index` work requests of its list and
// refuses the rest with `error`, returning the refused one in bad_wr.
void fail_next_post_at(int index, int error);
// The next op executed by post_send completes with `status` (no bytes move)
// and sends its QP to the error state, as a NIC does.
void fail_next_op(ibv_wc_status status);
QpSnapshot qp(uint32_t qp_num);
LiveObjects live();
// ops executed (reached a QP's send queue) since reset().
int executed_ops();
// Completions pushed into a CQ that had no room (must stay 0).
int cq_overflows();

}  // namespace castmesh::fake_verbs
