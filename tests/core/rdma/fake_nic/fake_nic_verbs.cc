// See fake_nic_verbs.h. FAKE provider: each fake object embeds the libibverbs
// struct the backend sees and is found again by that struct's address.
#include "fake_nic_verbs.h"

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace castmesh::fake_nic {
namespace {

constexpr uint64_t kExportsMagic = 0x43494e454b4146ull;  // "FAKENIC"
constexpr int kMaxExportedMrs = 512;
constexpr int kMaxExportedQps = 64;
constexpr int kMaxQpWr = 256;

// What peers read of this process (process_vm_readv): a seqlock-guarded copy
// of the registrations and QPs.
struct ExportedMr {
  uint64_t addr;
  uint64_t length;
  uint32_t rkey;
  int32_t access;
};
struct ExportedQp {
  uint32_t qp_num;
  int32_t state;
  uint32_t dest_qp_num;
  int32_t access_flags;
};
struct Exports {
  uint64_t magic;
  std::atomic<uint64_t> seq;  // odd while being rewritten
  uint32_t mr_count;
  uint32_t qp_count;
  ExportedMr mrs[kMaxExportedMrs];
  ExportedQp qps[kMaxExportedQps];
};
Exports g_exports{kExportsMagic, {0}, 0, 0, {}, {}};

struct FakeMr {
  ibv_mr base{};
  int access = 0;
};

struct Wr {
  ibv_send_wr wr{};
  ibv_sge sge{};
  std::chrono::steady_clock::time_point due;
};

struct FakeCq {
  ibv_cq base{};
  int capacity = 0;
  std::deque<ibv_wc> entries;
};

struct FakeQp {
  ibv_qp base{};
  FakeCq* cq = nullptr;
  ibv_qp_state state = IBV_QPS_RESET;
  int access_flags = 0;
  uint32_t dest_qp_num = 0;
  ibv_gid dgid{};
  int max_send_wr = 0;
  int outstanding = 0;
  std::deque<Wr> queued;
};

struct State {
  std::mutex mu;
  ibv_device device{};
  ibv_context context{};
  ibv_pd pd{};
  std::map<ibv_mr*, std::unique_ptr<FakeMr>> mrs;
  std::map<ibv_cq*, std::unique_ptr<FakeCq>> cqs;
  std::map<uint32_t, std::unique_ptr<FakeQp>> qps;
  uint32_t next_key = 1;
  uint32_t next_qp_num = 0x100;
};

State& state() {
  static State* s = [] {
    auto* made = new State;  // never destroyed: I/O threads may poll during exit
    std::snprintf(made->device.name, sizeof made->device.name, "fake_nic0");
    made->device.transport_type = IBV_TRANSPORT_IB;
    made->context.device = &made->device;
    made->pd.context = &made->context;
    return made;
  }();
  return *s;
}

// Rewrites the exported copy (s.mu held).
void publish(State& s) {
  g_exports.seq.fetch_add(1, std::memory_order_acq_rel);
  uint32_t n = 0;
  for (const auto& [key, mr] : s.mrs) {
    if (n == kMaxExportedMrs) break;
    g_exports.mrs[n++] = ExportedMr{reinterpret_cast<uint64_t>(mr->base.addr), mr->base.length, mr->base.rkey,
                                    mr->access};
  }
  g_exports.mr_count = n;
  n = 0;
  for (const auto& [num, qp] : s.qps) {
    if (n == kMaxExportedQps) break;
    g_exports.qps[n++] = ExportedQp{num, qp->state, qp->dest_qp_num, qp->access_flags};
  }
  g_exports.qp_count = n;
  g_exports.seq.fetch_add(1, std::memory_order_acq_rel);
}

ibv_gid own_gid() {
  ibv_gid gid{};
  std::memcpy(gid.raw, "FAKE", 4);
  const auto pid = static_cast<uint32_t>(::getpid());
  for (int i = 0; i < 4; ++i) gid.raw[4 + i] = static_cast<uint8_t>(pid >> (24 - 8 * i));
  const auto address = reinterpret_cast<uint64_t>(&g_exports);
  std::memcpy(gid.raw + 8, &address, 8);
  return gid;
}

bool read_peer(pid_t pid, uint64_t address, void* into, size_t size) {
  iovec local{into, size};
  iovec remote{reinterpret_cast<void*>(address), size};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(size);
}

// A consistent copy of the peer process's exports; false when it is gone.
bool peer_exports(pid_t pid, uint64_t address, Exports* copy) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (!read_peer(pid, address, copy, sizeof(Exports))) return false;
    uint64_t seq_after = 0;
    if (!read_peer(pid, address + offsetof(Exports, seq), &seq_after, sizeof seq_after)) return false;
    const uint64_t seq_before = copy->seq.load(std::memory_order_relaxed);
    if (copy->magic == kExportsMagic && seq_before % 2 == 0 && seq_before == seq_after) return true;
  }
  return false;
}

ibv_device** get_device_list(int* num) {
  State& s = state();
  auto** list = new ibv_device*[2]{&s.device, nullptr};
  if (num != nullptr) *num = 1;
  return list;
}

void free_device_list(ibv_device** list) { delete[] list; }

const char* get_device_name(ibv_device* device) { return device->name; }

ibv_context* open_device(ibv_device*) { return &state().context; }

int close_device(ibv_context*) { return 0; }

int query_device(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "fake-nic-1.0");
  attr->max_mr_size = uint64_t{1} << 40;
  attr->max_qp = kMaxExportedQps;
  attr->max_qp_wr = kMaxQpWr;
  attr->max_cq = 1024;
  attr->max_cqe = 4096;
  attr->max_mr = kMaxExportedMrs;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->phys_port_cnt = 1;
  return 0;
}

int query_port(ibv_context*, uint8_t port, ibv_port_attr* attr) {
  if (port != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->lid = 0;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  attr->max_msg_sz = 1u << 30;
  attr->gid_tbl_len = 4;
  return 0;
}

int query_gid(ibv_context*, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || index >= 4) return EINVAL;
  *gid = own_gid();
  return 0;
}

ibv_pd* alloc_pd(ibv_context*) { return &state().pd; }

int dealloc_pd(ibv_pd*) { return 0; }

ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      s.mrs.size() >= kMaxExportedMrs) {
    errno = (access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE) ? EINVAL : ENOMEM;
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
  publish(s);
  return key;
}

int dereg_mr(ibv_mr* mr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.mrs.erase(mr) != 1) return EINVAL;
  publish(s);
  return 0;
}

ibv_cq* create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto cq = std::make_unique<FakeCq>();
  cq->base.context = context;
  cq->base.cq_context = cq_context;
  cq->base.channel = channel;
  cq->base.cqe = cqe;
  cq->capacity = cqe;
  ibv_cq* key = &cq->base;
  s.cqs[key] = std::move(cq);
  return key;
}

int destroy_cq(ibv_cq* cq) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.cqs.erase(cq) == 1 ? 0 : EINVAL;
}

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (attr->qp_type != IBV_QPT_RC || attr->send_cq == nullptr || attr->cap.max_send_wr > kMaxQpWr ||
      s.qps.size() >= kMaxExportedQps) {
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
  qp->max_send_wr = static_cast<int>(attr->cap.max_send_wr);
  ibv_qp* key = &qp->base;
  s.qps[qp->base.qp_num] = std::move(qp);
  publish(s);
  return key;
}

int destroy_qp(ibv_qp* qp) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.qps.erase(qp->qp_num) != 1) return EINVAL;  // what it still held never runs
  publish(s);
  return 0;
}

int modify_qp(ibv_qp* qp_base, ibv_qp_attr* attr, int mask) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeQp& qp = *s.qps.at(qp_base->qp_num);
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  const ibv_qp_state to = attr->qp_state;
  if (to == IBV_QPS_INIT) {
    qp.access_flags = attr->qp_access_flags;
  } else if (to == IBV_QPS_RTR) {
    if (!attr->ah_attr.is_global) return EINVAL;  // RoCE: addressed by GID
    qp.dest_qp_num = attr->dest_qp_num;
    qp.dgid = attr->ah_attr.grh.dgid;
  }
  qp.state = to;
  qp.base.state = to;
  publish(s);
  return 0;
}

const FakeMr* find_local_mr(State& s, uint32_t lkey) {
  for (const auto& [ptr, mr] : s.mrs) {
    if (mr->base.lkey == lkey) return mr.get();
  }
  return nullptr;
}

// Runs one work request across processes; the status a NIC would complete it with.
ibv_wc_status execute(State& s, FakeQp& qp, const Wr& queued) {
  if (qp.state == IBV_QPS_ERR) return IBV_WC_WR_FLUSH_ERR;
  const ibv_send_wr& wr = queued.wr;
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  const ibv_sge& sge = queued.sge;
  const FakeMr* local = find_local_mr(s, sge.lkey);
  const auto local_start = local == nullptr ? 0 : reinterpret_cast<uint64_t>(local->base.addr);
  if (local == nullptr || sge.addr < local_start || sge.addr + sge.length > local_start + local->base.length ||
      (read && !(local->access & IBV_ACCESS_LOCAL_WRITE))) {
    return IBV_WC_LOC_PROT_ERR;
  }
  if (std::memcmp(qp.dgid.raw, "FAKE", 4) != 0) return IBV_WC_RETRY_EXC_ERR;
  uint32_t pid_bits = 0;
  for (int i = 0; i < 4; ++i) pid_bits = (pid_bits << 8) | qp.dgid.raw[4 + i];
  const auto pid = static_cast<pid_t>(pid_bits);
  uint64_t address = 0;
  std::memcpy(&address, qp.dgid.raw + 8, 8);
  auto peer = std::make_unique<Exports>();
  if (!peer_exports(pid, address, peer.get())) return IBV_WC_RETRY_EXC_ERR;  // the peer process is gone
  const ExportedQp* peer_qp = nullptr;
  for (uint32_t i = 0; i < peer->qp_count && i < kMaxExportedQps; ++i) {
    if (peer->qps[i].qp_num == qp.dest_qp_num) peer_qp = &peer->qps[i];
  }
  if (peer_qp == nullptr || (peer_qp->state != IBV_QPS_RTR && peer_qp->state != IBV_QPS_RTS) ||
      peer_qp->dest_qp_num != qp.base.qp_num) {
    return IBV_WC_RETRY_EXC_ERR;
  }
  const int needed = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  const uint64_t remote = wr.wr.rdma.remote_addr;
  bool allowed = false;
  for (uint32_t i = 0; i < peer->mr_count && i < kMaxExportedMrs; ++i) {
    const ExportedMr& mr = peer->mrs[i];
    if (mr.rkey == wr.wr.rdma.rkey && remote >= mr.addr && remote + sge.length <= mr.addr + mr.length &&
        (mr.access & needed)) {
      allowed = true;
    }
  }
  if (!allowed || !(peer_qp->access_flags & needed)) return IBV_WC_REM_ACCESS_ERR;
  if (sge.length == 0) return IBV_WC_SUCCESS;
  iovec mine{reinterpret_cast<void*>(sge.addr), sge.length};
  iovec theirs{reinterpret_cast<void*>(remote), sge.length};
  const ssize_t moved = read ? ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0)
                             : ::process_vm_writev(pid, &mine, 1, &theirs, 1, 0);
  return moved == static_cast<ssize_t>(sge.length) ? IBV_WC_SUCCESS : IBV_WC_RETRY_EXC_ERR;
}

int post_send(ibv_qp* qp_base, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeQp& qp = *s.qps.at(qp_base->qp_num);
  if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_ERR) {
    *bad_wr = wr;
    return EINVAL;
  }
  const char* delay_text = std::getenv("CASTMESH_FAKE_NIC_DELAY_MS");
  const auto due = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(delay_text == nullptr ? 0 : std::atoi(delay_text));
  for (; wr != nullptr; wr = wr->next) {
    if (qp.outstanding >= qp.max_send_wr) {
      *bad_wr = wr;
      return ENOMEM;  // what providers say when the send queue is full
    }
    if ((wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE) || wr->num_sge != 1) {
      *bad_wr = wr;
      return EINVAL;
    }
    ++qp.outstanding;
    Wr queued;
    queued.wr = *wr;
    queued.sge = wr->sg_list[0];
    queued.wr.next = nullptr;
    queued.wr.sg_list = nullptr;
    queued.due = due;
    qp.queued.push_back(queued);
  }
  return 0;
}

// Runs the due work requests of every QP feeding `cq` (s.mu held).
void run_due(State& s, FakeCq& cq) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [num, qp] : s.qps) {
    if (qp->cq != &cq) continue;
    uint32_t unsignaled_run = 0;
    while (!qp->queued.empty() && qp->queued.front().due <= now) {
      const Wr wr = qp->queued.front();
      qp->queued.pop_front();
      ++unsignaled_run;
      const ibv_wc_status status = execute(s, *qp, wr);
      if (status != IBV_WC_SUCCESS && qp->state != IBV_QPS_ERR) {
        qp->state = IBV_QPS_ERR;
        publish(s);
      }
      if (!(wr.wr.send_flags & IBV_SEND_SIGNALED) && status == IBV_WC_SUCCESS) continue;
      ibv_wc wc{};
      wc.wr_id = wr.wr.wr_id;
      wc.status = status;
      wc.opcode = wr.wr.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
      wc.byte_len = wr.wr.opcode == IBV_WR_RDMA_READ ? wr.sge.length : 0;
      wc.qp_num = num;
      wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x42;
      qp->outstanding -= static_cast<int>(unsignaled_run);
      unsignaled_run = 0;
      if (static_cast<int>(cq.entries.size()) < cq.capacity) cq.entries.push_back(wc);
    }
    qp->outstanding -= static_cast<int>(unsignaled_run);
  }
}

int poll_cq(ibv_cq* cq_base, int num_entries, ibv_wc* wc) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeCq& cq = *s.cqs.at(cq_base);
  run_due(s, cq);
  int n = 0;
  while (n < num_entries && !cq.entries.empty()) {
    wc[n++] = cq.entries.front();
    cq.entries.pop_front();
  }
  return n;
}

const rdma_verbs_ops kFakeNicOps = {
    get_device_list, free_device_list, get_device_name, open_device, close_device, query_device, query_port,
    query_gid,       alloc_pd,         dealloc_pd,      reg_mr,      dereg_mr,     create_cq,    destroy_cq,
    create_qp,       destroy_qp,       modify_qp,       post_send,   poll_cq,
};

}  // namespace

const rdma_verbs_ops* ops() { return &kFakeNicOps; }

}  // namespace castmesh::fake_nic
