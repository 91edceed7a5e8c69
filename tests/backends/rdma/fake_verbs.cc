// See fake_verbs.h. Each fake object embeds the libibverbs struct the backend
// sees (ibv_context, ibv_mr, ...) and is found again by that struct's address.
#include "fake_verbs.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace castmesh::fake_verbs {
namespace {

struct FakeDevice {
  ibv_device base{};
  DeviceSpec spec;
  int index = 0;
};

struct FakeContext {
  ibv_context base{};
  int device = 0;
};

struct FakePd {
  ibv_pd base{};
};

struct FakeMr {
  ibv_mr base{};
  int access = 0;
};

struct Cqe {
  ibv_wc wc{};
  uint32_t retires = 0;  // send-queue slots this completion frees
};

struct FakeCq {
  ibv_cq base{};
  int capacity = 0;
  std::deque<Cqe> entries;
};

struct FakeQp {
  ibv_qp base{};
  FakeCq* cq = nullptr;
  int device = 0;
  QpSnapshot snapshot;
  int outstanding = 0;
  uint32_t unsignaled_run = 0;
};

struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::map<ibv_context*, std::unique_ptr<FakeContext>> contexts;
  std::map<ibv_pd*, std::unique_ptr<FakePd>> pds;
  std::map<ibv_mr*, std::unique_ptr<FakeMr>> mrs;
  std::map<ibv_cq*, std::unique_ptr<FakeCq>> cqs;
  std::map<uint32_t, std::unique_ptr<FakeQp>> qps;  // by qp_num
  std::map<Call, int> failures;
  std::optional<ibv_wc_status> failing_op;
  std::optional<std::pair<int, int>> failing_post;  // (index, errno)
  uint32_t next_key = 1;
  uint32_t next_qp_num = 0x100;
  int executed = 0;
  int overflows = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: tests may run to exit
  return *s;
}

// Consumes an injected failure of `call`; true (and errno set) if there was one.
bool injected(State& s, Call call, int* error) {
  auto it = s.failures.find(call);
  if (it == s.failures.end()) return false;
  *error = it->second;
  s.failures.erase(it);
  return true;
}

const FakeDevice& device_of(State& s, ibv_context* context) { return *s.devices[s.contexts.at(context)->device]; }

ibv_gid gid_of(int device_index) {
  ibv_gid gid{};
  gid.raw[0] = 0xfe;
  gid.raw[1] = 0x80;
  gid.raw[15] = static_cast<uint8_t>(device_index + 1);
  return gid;
}

ibv_device** get_device_list(int* num) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kGetDeviceList, &error)) {
    if (error != 0) {
      errno = error;
      return nullptr;
    }
    *num = 0;
    return new ibv_device*[1]{nullptr};
  }
  auto** list = new ibv_device*[s.devices.size() + 1];
  for (size_t i = 0; i < s.devices.size(); ++i) list[i] = &s.devices[i]->base;
  list[s.devices.size()] = nullptr;
  if (num != nullptr) *num = static_cast<int>(s.devices.size());
  return list;
}

void free_device_list(ibv_device** list) { delete[] list; }

const char* get_device_name(ibv_device* device) { return device->name; }

ibv_context* open_device(ibv_device* device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kOpenDevice, &error)) {
    errno = error;
    return nullptr;
  }
  auto context = std::make_unique<FakeContext>();
  context->base.device = device;
  for (const auto& d : s.devices) {
    if (&d->base == device) context->device = d->index;
  }
  ibv_context* key = &context->base;
  s.contexts[key] = std::move(context);
  return key;
}

int close_device(ibv_context* context) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [key, pd] : s.pds) {
    if (pd->base.context == context) return EBUSY;
  }
  return s.contexts.erase(context) == 1 ? 0 : EINVAL;
}

int query_device(ibv_context* context, ibv_device_attr* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const DeviceSpec& spec = device_of(s, context).spec;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "fake-1.0");
  attr->max_mr_size = uint64_t{1} << 40;
  attr->max_qp = 1024;
  attr->max_qp_wr = spec.max_qp_wr;
  attr->max_cq = 1024;
  attr->max_cqe = 4096;
  attr->max_mr = 1024;
  attr->max_qp_rd_atom = spec.max_qp_rd_atom;
  attr->max_qp_init_rd_atom = spec.max_qp_rd_atom;
  attr->phys_port_cnt = 1;
  return 0;
}

int query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (port != 1) return EINVAL;
  const DeviceSpec& spec = device_of(s, context).spec;
  *attr = ibv_port_attr{};
  attr->state = spec.port_state;
  attr->max_mtu = spec.mtu;
  attr->active_mtu = spec.mtu;
  attr->lid = spec.lid;
  attr->link_layer = spec.link_layer;
  attr->max_msg_sz = 1u << 30;
  attr->gid_tbl_len = 4;
  return 0;
}

int query_gid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (port != 1 || index < 0 || index >= 4) return EINVAL;
  *gid = gid_of(device_of(s, context).index);
  return 0;
}

ibv_pd* alloc_pd(ibv_context* context) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kAllocPd, &error)) {
    errno = error;
    return nullptr;
  }
  auto pd = std::make_unique<FakePd>();
  pd->base.context = context;
  ibv_pd* key = &pd->base;
  s.pds[key] = std::move(pd);
  return key;
}

int dealloc_pd(ibv_pd* pd) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [key, mr] : s.mrs) {
    if (mr->base.pd == pd) return EBUSY;
  }
  for (const auto& [key, qp] : s.qps) {
    if (qp->base.pd == pd) return EBUSY;
  }
  return s.pds.erase(pd) == 1 ? 0 : EINVAL;
}

ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kRegMr, &error)) {
    errno = error;
    return nullptr;
  }
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;  // what the verbs demand
    return nullptr;
  }
  auto mr = std::make_unique<FakeMr>();
  mr->base.context = pd->context;
  mr->base.pd = pd;
  mr->base.addr = addr;
  mr->base.length = length;
  mr->base.lkey = 0x1000 + s.next_key;
  mr->base.rkey = 0x80000 + s.next_key;
  ++s.next_key;
  mr->access = access;
  ibv_mr* key = &mr->base;
  s.mrs[key] = std::move(mr);
  return key;
}

int dereg_mr(ibv_mr* mr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.mrs.erase(mr) == 1 ? 0 : EINVAL;
}

ibv_cq* create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kCreateCq, &error)) {
    errno = error;
    return nullptr;
  }
  auto cq = std::make_unique<FakeCq>();
  cq->base.context = context;
  cq->base.cq_context = cq_context;
  cq->base.channel = channel;
  cq->base.cqe = cqe;
  cq->capacity = cqe;
  (void)comp_vector;
  ibv_cq* key = &cq->base;
  s.cqs[key] = std::move(cq);
  return key;
}

int destroy_cq(ibv_cq* cq) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [num, qp] : s.qps) {
    if (&qp->cq->base == cq) return EBUSY;
  }
  return s.cqs.erase(cq) == 1 ? 0 : EINVAL;
}

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  int error = 0;
  if (injected(s, Call::kCreateQp, &error)) {
    errno = error;
    return nullptr;
  }
  const FakeDevice& device = device_of(s, pd->context);
  if (attr->qp_type != IBV_QPT_RC || attr->send_cq == nullptr ||
      attr->cap.max_send_wr > static_cast<uint32_t>(device.spec.max_qp_wr)) {
    errno = EINVAL;
    return nullptr;
  }
  auto qp = std::make_unique<FakeQp>();
  qp->base.context = pd->context;
  qp->base.pd = pd;
  qp->base.send_cq = attr->send_cq;
  qp->base.recv_cq = attr->recv_cq;
  qp->base.qp_num = s.next_qp_num++;
  qp->base.qp_type = IBV_QPT_RC;
  qp->base.state = IBV_QPS_RESET;
  qp->cq = s.cqs.at(attr->send_cq).get();
  qp->device = device.index;
  qp->snapshot.exists = true;
  qp->snapshot.max_send_wr = static_cast<int>(attr->cap.max_send_wr);
  qp->snapshot.sq_sig_all = attr->sq_sig_all != 0;
  ibv_qp* key = &qp->base;
  s.qps[qp->base.qp_num] = std::move(qp);
  return key;
}

int destroy_qp(ibv_qp* qp) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.qps.erase(qp->qp_num) == 1 ? 0 : EINVAL;
}

// The attr_mask bits a transition needs (IBV_QP_STATE aside).
int required_mask(ibv_qp_state from, ibv_qp_state to) {
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    return IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    return IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
           IBV_QP_MIN_RNR_TIMER;
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    return IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  if (to == IBV_QPS_ERR || to == IBV_QPS_RESET) return 0;
  return -1;  // not a legal transition
}

int modify_qp(ibv_qp* qp_base, ibv_qp_attr* attr, int mask) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeQp& qp = *s.qps.at(qp_base->qp_num);
  const DeviceSpec& spec = s.devices[qp.device]->spec;
  QpSnapshot& snap = qp.snapshot;
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  const ibv_qp_state to = attr->qp_state;
  const int needed = required_mask(snap.state, to);
  if (needed < 0 || (mask & needed) != needed) return EINVAL;
  int error = 0;
  if ((to == IBV_QPS_INIT && injected(s, Call::kModifyQpToInit, &error)) ||
      (to == IBV_QPS_RTR && injected(s, Call::kModifyQpToRtr, &error)) ||
      (to == IBV_QPS_RTS && injected(s, Call::kModifyQpToRts, &error))) {
    return error;
  }
  if (to == IBV_QPS_INIT) {
    if (attr->port_num != 1) return EINVAL;
    snap.access_flags = attr->qp_access_flags;
  } else if (to == IBV_QPS_RTR) {
    if (attr->path_mtu > spec.mtu || attr->max_dest_rd_atomic > spec.max_qp_rd_atom || attr->max_dest_rd_atomic == 0 ||
        (!attr->ah_attr.is_global && attr->ah_attr.dlid == 0) || attr->dest_qp_num > 0xFFFFFF) {
      return EINVAL;
    }
    snap.path_mtu = attr->path_mtu;
    snap.dest_qp_num = attr->dest_qp_num;
    snap.rq_psn = attr->rq_psn;
    snap.max_dest_rd_atomic = attr->max_dest_rd_atomic;
    snap.dlid = attr->ah_attr.dlid;
    snap.is_global = attr->ah_attr.is_global != 0;
  } else if (to == IBV_QPS_RTS) {
    if (attr->max_rd_atomic > spec.max_qp_rd_atom || attr->sq_psn > 0xFFFFFF) return EINVAL;
    snap.timeout = attr->timeout;
    snap.retry_cnt = attr->retry_cnt;
    snap.rnr_retry = attr->rnr_retry;
    snap.sq_psn = attr->sq_psn;
    snap.max_rd_atomic = attr->max_rd_atomic;
  }
  snap.state = to;
  qp.base.state = to;
  return 0;
}

FakeMr* find_mr(State& s, ibv_pd* pd, uint32_t key, bool remote) {
  for (auto& [ptr, mr] : s.mrs) {
    if (mr->base.pd == pd && (remote ? mr->base.rkey : mr->base.lkey) == key) return mr.get();
  }
  return nullptr;
}

bool covers(const FakeMr& mr, uint64_t addr, uint64_t length) {
  const auto start = reinterpret_cast<uint64_t>(mr.base.addr);
  return addr >= start && addr + length <= start + mr.base.length;
}

// The connected peer of `qp`, if the fabric would deliver to it.
FakeQp* peer_of(State& s, const FakeQp& qp) {
  auto it = s.qps.find(qp.snapshot.dest_qp_num);
  if (it == s.qps.end()) return nullptr;
  FakeQp& peer = *it->second;
  const bool ready = peer.snapshot.state == IBV_QPS_RTR || peer.snapshot.state == IBV_QPS_RTS;
  const bool routed = qp.snapshot.is_global || qp.snapshot.dlid == s.devices[peer.device]->spec.lid;
  if (!ready || !routed || peer.snapshot.dest_qp_num != qp.base.qp_num) return nullptr;
  return &peer;
}

// Runs one work request; the status a NIC would complete it with.
ibv_wc_status execute(State& s, FakeQp& qp, const ibv_send_wr& wr) {
  if (qp.snapshot.state == IBV_QPS_ERR) return IBV_WC_WR_FLUSH_ERR;
  if (s.failing_op) {
    const ibv_wc_status status = *s.failing_op;
    s.failing_op.reset();
    return status;
  }
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  if ((!read && wr.opcode != IBV_WR_RDMA_WRITE) || wr.num_sge != 1) return IBV_WC_LOC_QP_OP_ERR;
  const ibv_sge& sge = wr.sg_list[0];
  FakeMr* local = find_mr(s, qp.base.pd, sge.lkey, false);
  if (local == nullptr || !covers(*local, sge.addr, sge.length) ||
      (read && !(local->access & IBV_ACCESS_LOCAL_WRITE))) {
    return IBV_WC_LOC_PROT_ERR;
  }
  FakeQp* peer = peer_of(s, qp);
  if (peer == nullptr) return IBV_WC_RETRY_EXC_ERR;
  const int needed = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  FakeMr* remote = find_mr(s, peer->base.pd, wr.wr.rdma.rkey, true);
  if (remote == nullptr || !covers(*remote, wr.wr.rdma.remote_addr, sge.length) || !(remote->access & needed) ||
      !(peer->snapshot.access_flags & needed)) {
    return IBV_WC_REM_ACCESS_ERR;
  }
  void* local_bytes = reinterpret_cast<void*>(sge.addr);
  void* remote_bytes = reinterpret_cast<void*>(wr.wr.rdma.remote_addr);
  if (sge.length > 0) {
    if (read) {
      std::memmove(local_bytes, remote_bytes, sge.length);
    } else {
      std::memmove(remote_bytes, local_bytes, sge.length);
    }
  }
  return IBV_WC_SUCCESS;
}

int post_send(ibv_qp* qp_base, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeQp& qp = *s.qps.at(qp_base->qp_num);
  int error = 0;
  if (injected(s, Call::kPostSend, &error)) {
    *bad_wr = wr;
    return error;
  }
  if (qp.snapshot.state != IBV_QPS_RTS && qp.snapshot.state != IBV_QPS_ERR) {
    *bad_wr = wr;
    return EINVAL;
  }
  std::optional<std::pair<int, int>> refuse = s.failing_post;
  s.failing_post.reset();
  for (int index = 0; wr != nullptr; wr = wr->next, ++index) {
    if (refuse && refuse->first == index) {
      *bad_wr = wr;
      return refuse->second;
    }
    if (qp.outstanding >= qp.snapshot.max_send_wr) {
      *bad_wr = wr;
      return ENOMEM;  // what providers say when the send queue is full
    }
    ++qp.outstanding;
    ++qp.unsignaled_run;
    ++s.executed;
    const ibv_wc_status status = execute(s, qp, *wr);
    if (status != IBV_WC_SUCCESS) qp.snapshot.state = IBV_QPS_ERR;
    const bool signaled = (wr->send_flags & IBV_SEND_SIGNALED) || qp.snapshot.sq_sig_all;
    if (!signaled && status == IBV_WC_SUCCESS) continue;
    Cqe cqe;
    cqe.wc.wr_id = wr->wr_id;
    cqe.wc.status = status;
    cqe.wc.opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    cqe.wc.byte_len = wr->opcode == IBV_WR_RDMA_READ ? wr->sg_list[0].length : 0;
    cqe.wc.qp_num = qp.base.qp_num;
    cqe.wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x42;
    cqe.retires = qp.unsignaled_run;
    qp.unsignaled_run = 0;
    if (static_cast<int>(qp.cq->entries.size()) >= qp.cq->capacity) {
      ++s.overflows;
    } else {
      qp.cq->entries.push_back(cqe);
    }
  }
  return 0;
}

int poll_cq(ibv_cq* cq_base, int num_entries, ibv_wc* wc) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeCq& cq = *s.cqs.at(cq_base);
  int n = 0;
  while (n < num_entries && !cq.entries.empty()) {
    const Cqe cqe = cq.entries.front();
    cq.entries.pop_front();
    auto it = s.qps.find(cqe.wc.qp_num);
    if (it != s.qps.end()) it->second->outstanding -= static_cast<int>(cqe.retires);
    wc[n++] = cqe.wc;
  }
  return n;
}

const rdma_verbs_ops kFakeOps = {
    get_device_list, free_device_list, get_device_name, open_device, close_device, query_device, query_port,
    query_gid,       alloc_pd,         dealloc_pd,      reg_mr,      dereg_mr,     create_cq,    destroy_cq,
    create_qp,       destroy_qp,       modify_qp,       post_send,   poll_cq,
};

}  // namespace

const rdma_verbs_ops* ops() { return &kFakeOps; }

void reset(std::vector<DeviceSpec> devices) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.qps.clear();
  s.cqs.clear();
  s.mrs.clear();
  s.pds.clear();
  s.contexts.clear();
  s.devices.clear();
  s.failures.clear();
  s.failing_op.reset();
  s.failing_post.reset();
  s.executed = 0;
  s.overflows = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto device = std::make_unique<FakeDevice>();
    std::snprintf(device->base.name, sizeof device->base.name, "%s", devices[i].name.c_str());
    device->base.transport_type = IBV_TRANSPORT_IB;  // RoCE devices report IB too
    device->spec = std::move(devices[i]);
    device->index = static_cast<int>(i);
    s.devices.push_back(std::move(device));
  }
}

void fail_next(Call call, int error) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.failures[call] = error;
}

void fail_next_post_at(int index, int error) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.failing_post = std::make_pair(index, error);
}

void fail_next_op(ibv_wc_status status) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.failing_op = status;
}

QpSnapshot qp(uint32_t qp_num) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.qps.find(qp_num);
  return it == s.qps.end() ? QpSnapshot{} : it->second->snapshot;
}

LiveObjects live() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return LiveObjects{static_cast<int>(s.contexts.size()), static_cast<int>(s.pds.size()),
                     static_cast<int>(s.mrs.size()), static_cast<int>(s.cqs.size()), static_cast<int>(s.qps.size())};
}

int executed_ops() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.executed;
}

int cq_overflows() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.overflows;
}

}  // namespace castmesh::fake_verbs
