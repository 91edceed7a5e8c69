// FakeNccl (see fake_cuda.h): in-process ranks meeting in cliques, and
// (CASTMESH_FAKE_TE_NCCL=shm) ranks in different processes of one host
// meeting in a POSIX shared-memory segment the unique id names.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "fake_cuda.h"

namespace castmesh::fakes {
namespace {

// The ncclResult_t values the fake returns.
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 4;
constexpr int kInvalidUsage = 5;
constexpr int kRemoteError = 6;

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kSend, kRecv };

// One call, as the stream thread will run it.
struct Op {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int reduce;
  int peer;  // root for broadcast
  uint64_t seq;  // position among the comm's collectives (not send/recv)
};

struct Part {
  const void* send = nullptr;
  void* recv = nullptr;
};
// One collective across the ranks: each rank's buffers, done when computed.
struct Round {
  std::vector<Part> parts;
  int arrived = 0;
  int left = 0;
  bool done = false;
};
// A posted send waiting for the peer's recv.
struct Transfer {
  const void* buf;
  size_t bytes;
  bool consumed = false;
};

// The cross-process rendezvous: a shared-memory segment (zeroed by
// ftruncate) holding this header, then one slot per rank where a rank puts
// its input of collective number g before setting arrived[rank] = g; it sets
// left[rank] = g once it read every slot, so a slot is rewritten only after
// all ranks left the previous collective.
constexpr int kShmMaxRanks = 8;
constexpr size_t kShmHeaderBytes = 4096;
constexpr size_t kShmSlotBytes = size_t{1} << 20;
constexpr char kShmIdPrefix[] = "FakeNcclShm:";
struct ShmHeader {
  std::atomic<int32_t> nranks;
  std::atomic<int32_t> pids[kShmMaxRanks];
  std::atomic<uint64_t> arrived[kShmMaxRanks];
  std::atomic<uint64_t> left[kShmMaxRanks];
};
static_assert(sizeof(ShmHeader) <= kShmHeaderBytes);

// One rank's mapping of the segment.
struct ShmSegment {
  void* base = nullptr;
  size_t size = 0;
  int nranks = 0;
  ShmHeader* header() const { return static_cast<ShmHeader*>(base); }
  char* slot(int rank) const { return static_cast<char*>(base) + kShmHeaderBytes + kShmSlotBytes * rank; }
  ~ShmSegment() {
    if (base != nullptr) munmap(base, size);
  }
};

struct Comm;
struct Clique {
  std::mutex mu;
  std::condition_variable cv;
  int nranks = 0;
  int joined ABSL_GUARDED_BY(mu) = 0;
  std::vector<Comm*> comms ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Round> rounds ABSL_GUARDED_BY(mu);
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Transfer>>> mail ABSL_GUARDED_BY(mu);  // (src, dst)
};

struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  std::atomic<uint64_t> next_seq{0};
  // Guarded by clique->mu.
  bool aborted = false;
  int async_error = kSuccess;
  int inflight = 0;
  std::unique_ptr<ShmSegment> shm;  // set for a cross-process comm
};

std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<Clique>> g_cliques ABSL_GUARDED_BY(g_registry_mu);
std::atomic<uint64_t> g_next_id{1};
std::atomic<int64_t> g_live_comms{0};
CASTMESH_FAKE_THREAD_LOCAL std::string t_last_error;
CASTMESH_FAKE_THREAD_LOCAL int t_group_depth = 0;
struct Pending {
  Comm* comm;
  void* stream;
  Op op;
};
CASTMESH_FAKE_THREAD_LOCAL std::vector<Pending> t_pending;

int fail(int result, std::string why) {
  t_last_error = std::move(why);
  return result;
}

size_t element_size(int dtype) {
  switch (dtype) {
    case 0: case 1: return 1;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    default: return 0;  // float16 / bfloat16: not in the fake
  }
}

template <typename T>
T combine(int reduce, T a, T b) {
  switch (reduce) {
    case 1: return static_cast<T>(a * b);
    case 2: return a > b ? a : b;
    case 3: return a < b ? a : b;
    default: return static_cast<T>(a + b);  // sum, and avg before the division
  }
}

// out[i] = reduction over ranks of part(rank)[offset + i].
template <typename T>
void reduce_into(const Round& round, const Op& op, size_t offset, T* out) {
  const int n = static_cast<int>(round.parts.size());
  for (size_t i = 0; i < op.count; ++i) {
    T acc;
    std::memcpy(&acc, static_cast<const T*>(round.parts[0].send) + offset + i, sizeof(T));
    for (int k = 1; k < n; ++k) {
      T value;
      std::memcpy(&value, static_cast<const T*>(round.parts[k].send) + offset + i, sizeof(T));
      acc = combine<T>(op.reduce, acc, value);
    }
    if (op.reduce == 4) acc = static_cast<T>(acc / static_cast<T>(n));
    out[i] = acc;
  }
}

template <typename T>
void compute_typed(Round& round, const Op& op) {
  const int n = static_cast<int>(round.parts.size());
  const size_t bytes = op.count * sizeof(T);
  // Results go through scratch first: send and recv may be the same buffer.
  if (op.kind == Kind::kReduceScatter) {
    std::vector<std::vector<T>> blocks(n, std::vector<T>(op.count));
    for (int r = 0; r < n; ++r) reduce_into<T>(round, op, static_cast<size_t>(r) * op.count, blocks[r].data());
    for (int r = 0; r < n; ++r) {
      if (round.parts[r].recv != nullptr) std::memcpy(round.parts[r].recv, blocks[r].data(), bytes);
    }
    return;
  }
  std::vector<char> result;
  if (op.kind == Kind::kAllReduce) {
    result.resize(bytes);
    reduce_into<T>(round, op, 0, reinterpret_cast<T*>(result.data()));
  } else if (op.kind == Kind::kBroadcast) {
    result.assign(static_cast<const char*>(round.parts[op.peer].send),
                  static_cast<const char*>(round.parts[op.peer].send) + bytes);
  } else {  // allgather
    result.resize(bytes * n);
    for (int k = 0; k < n; ++k) std::memcpy(result.data() + bytes * k, round.parts[k].send, bytes);
  }
  for (int r = 0; r < n; ++r) {
    if (round.parts[r].recv != nullptr) std::memcpy(round.parts[r].recv, result.data(), result.size());
  }
}

void compute(Round& round, const Op& op) {
  switch (op.dtype) {
    case 0: compute_typed<int8_t>(round, op); break;
    case 1: compute_typed<uint8_t>(round, op); break;
    case 2: compute_typed<int32_t>(round, op); break;
    case 3: compute_typed<uint32_t>(round, op); break;
    case 4: compute_typed<int64_t>(round, op); break;
    case 5: compute_typed<uint64_t>(round, op); break;
    case 7: compute_typed<float>(round, op); break;
    default: compute_typed<double>(round, op); break;
  }
}

// Runs a collective round for comm's rank; false when the comm was aborted.
bool run_round(Comm* comm, const Op& op, std::unique_lock<std::mutex>& lock) {
  Clique& c = *comm->clique;
  Round& round = c.rounds[op.seq];
  if (round.parts.empty()) {
    round.parts.resize(c.nranks);
    round.left = c.nranks;
  }
  round.parts[comm->rank] = Part{op.send, op.recv};
  if (++round.arrived == c.nranks) {
    compute(round, op);
    round.done = true;
    c.cv.notify_all();
  }
  c.cv.wait(lock, [&] { return round.done || comm->aborted; });
  const bool done = round.done;
  if (--round.left == 0) c.rounds.erase(op.seq);
  return done;
}

void post_send(Comm* comm, const Op& op, std::vector<std::shared_ptr<Transfer>>& posted) {
  Clique& c = *comm->clique;
  auto transfer = std::make_shared<Transfer>(Transfer{op.send, op.count * element_size(op.dtype)});
  c.mail[{comm->rank, op.peer}].push_back(transfer);
  posted.push_back(std::move(transfer));
  c.cv.notify_all();
}

bool run_recv(Comm* comm, const Op& op, std::unique_lock<std::mutex>& lock) {
  Clique& c = *comm->clique;
  std::deque<std::shared_ptr<Transfer>>& queue = c.mail[{op.peer, comm->rank}];
  c.cv.wait(lock, [&] { return !queue.empty() || comm->aborted; });
  if (comm->aborted) return false;
  std::shared_ptr<Transfer> transfer = queue.front();
  queue.pop_front();
  const size_t bytes = op.count * element_size(op.dtype);
  std::memcpy(op.recv, transfer->buf, bytes < transfer->bytes ? bytes : transfer->bytes);
  if (bytes != transfer->bytes) comm->async_error = kInvalidUsage;  // NCCL's "size mismatch"
  transfer->consumed = true;
  c.cv.notify_all();
  return true;
}

// True once `pid` has exited (a zombie its parent has not reaped counts).
bool process_gone(int32_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(") ");
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

// Polls `ready` until it holds (true) or the comm is aborted (false). Like
// real NCCL, a dead peer does not end the wait: it turns the comm's async
// error to ncclRemoteError, and the caller's watchdog aborts the comm. A peer
// silent for a minute gets the same error, so even a caller that only polls
// the async error never hangs. `until_error` also ends the wait on that error
// (for init, which no watchdog aborts).
template <typename Ready>
bool shm_wait(Comm* comm, Ready ready, bool until_error = false) {
  const auto start = std::chrono::steady_clock::now();
  auto next_check = start;
  for (;;) {
    if (ready()) return true;
    {
      const auto now = std::chrono::steady_clock::now();
      std::lock_guard<std::mutex> lock(comm->clique->mu);
      if (comm->aborted || (until_error && comm->async_error != kSuccess)) return false;
      if (now >= next_check) {
        next_check = now + std::chrono::milliseconds(10);
        bool peer_gone = now - start > std::chrono::seconds(60);
        for (int r = 0; r < comm->shm->nranks && !peer_gone; ++r) {
          const int32_t pid = comm->shm->header()->pids[r].load();
          peer_gone = r != comm->rank && pid != 0 && process_gone(pid);
        }
        // A peer may have done its part and died between the look at
        // `ready` above and this check (a preempted waiter): what it wrote
        // before it died is visible now, so look again before calling it
        // a failure. Only a wait that the dead peer can no longer end fails.
        if (peer_gone && comm->async_error == kSuccess && !ready()) comm->async_error = kRemoteError;
      }
    }
    // Fake device work has no deadline to meet: sleeping keeps the host free.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

size_t input_bytes(const Op& op, int nranks) {
  const size_t bytes = op.count * element_size(op.dtype);
  return op.kind == Kind::kReduceScatter ? bytes * nranks : bytes;
}

// Collective number op.seq + 1 across processes; false when aborted.
bool run_shm_round(Comm* comm, const Op& op) {
  const ShmSegment& seg = *comm->shm;
  ShmHeader& h = *seg.header();
  const uint64_t gen = op.seq + 1;
  auto all_reached = [&](std::atomic<uint64_t>* marks, uint64_t at_least) {
    for (int r = 0; r < seg.nranks; ++r) {
      if (marks[r].load(std::memory_order_acquire) < at_least) return false;
    }
    return true;
  };
  if (!shm_wait(comm, [&] { return all_reached(h.left, gen - 1); })) return false;
  const bool has_input = op.kind != Kind::kBroadcast || op.peer == comm->rank;
  if (has_input) std::memcpy(seg.slot(comm->rank), op.send, input_bytes(op, seg.nranks));
  h.arrived[comm->rank].store(gen, std::memory_order_release);
  if (!shm_wait(comm, [&] { return all_reached(h.arrived, gen); })) return false;
  Round round;
  round.parts.resize(seg.nranks);
  for (int r = 0; r < seg.nranks; ++r) round.parts[r] = Part{seg.slot(r), r == comm->rank ? op.recv : nullptr};
  compute(round, op);
  h.left[comm->rank].store(gen, std::memory_order_release);
  return true;
}

// The stream task of one call or of a group: sends are posted first, so two
// ranks that send to each other inside a group do not block each other.
void run_ops(Comm* comm, const std::vector<Op>& ops) {
  Clique& c = *comm->clique;
  if (comm->shm != nullptr) {
    bool alive = true;
    for (const Op& op : ops) alive = alive && run_shm_round(comm, op);
    std::lock_guard<std::mutex> lock(c.mu);
    --comm->inflight;
    c.cv.notify_all();
    return;
  }
  std::unique_lock<std::mutex> lock(c.mu);
  std::vector<std::shared_ptr<Transfer>> posted;
  for (const Op& op : ops) {
    if (op.kind == Kind::kSend) post_send(comm, op, posted);
  }
  bool alive = true;
  for (const Op& op : ops) {
    if (!alive || op.kind == Kind::kSend) continue;
    alive = op.kind == Kind::kRecv ? run_recv(comm, op, lock) : run_round(comm, op, lock);
  }
  for (const std::shared_ptr<Transfer>& transfer : posted) {
    c.cv.wait(lock, [&] { return transfer->consumed || comm->aborted; });
  }
  --comm->inflight;
  c.cv.notify_all();
}

void enqueue(Comm* comm, void* stream, std::vector<Op> ops) {
  {
    std::lock_guard<std::mutex> lock(comm->clique->mu);
    ++comm->inflight;
  }
  FakeCuda::launch(stream, [comm, ops = std::move(ops)] { run_ops(comm, ops); });
}

int submit(void* comm_handle, void* stream, Op op) {
  Comm* comm = static_cast<Comm*>(comm_handle);
  if (element_size(op.dtype) == 0) return fail(kInvalidArgument, "the fake NCCL has no float16/bfloat16");
  if (comm->shm != nullptr) {
    if (op.kind == Kind::kSend || op.kind == Kind::kRecv) {
      return fail(kInvalidUsage, "the cross-process fake NCCL has no send/recv");
    }
    if (input_bytes(op, comm->shm->nranks) > kShmSlotBytes) {
      return fail(kInvalidArgument, "the cross-process fake NCCL carries at most 1 MiB per rank and call");
    }
  }
  if (op.kind != Kind::kSend && op.kind != Kind::kRecv) op.seq = comm->next_seq++;
  if (t_group_depth > 0) {
    t_pending.push_back(Pending{comm, stream, op});
    return kSuccess;
  }
  enqueue(comm, stream, {op});
  return kSuccess;
}

int get_version(int* version) {
  *version = 22800;
  return kSuccess;
}

bool across_procs() {
  const char* mode = std::getenv("CASTMESH_FAKE_TE_NCCL");
  return mode != nullptr && std::strcmp(mode, "shm") == 0;
}

// Across processes the id carries a segment name no other id shares (random,
// as ids made in different processes must not collide).
int get_unique_id(void* id) {
  std::memset(id, 0, CASTMESH_TE_UNIQUE_ID_BYTES);
  std::string text = "FakeNccl:" + std::to_string(getpid()) + ":" + std::to_string(g_next_id++);
  if (across_procs()) {
    std::random_device random;
    text = std::string(kShmIdPrefix) + "/castmesh-fake-nccl-" + std::to_string(getpid()) + "-" +
           std::to_string(random()) + std::to_string(random());
  }
  std::memcpy(id, text.data(), text.size());
  return kSuccess;
}

std::string key_of(const void* id) {
  return std::string(static_cast<const char*>(id), CASTMESH_TE_UNIQUE_ID_BYTES);
}

int comm_end(void* comm_handle, bool abort);

// Maps the segment `id` names and waits (bounded) for every rank to join it.
int join_segment(Comm* comm, int nranks, const void* id) {
  const char* text = static_cast<const char*>(id) + sizeof(kShmIdPrefix) - 1;
  const std::string name(text, strnlen(text, CASTMESH_TE_UNIQUE_ID_BYTES - (sizeof(kShmIdPrefix) - 1)));
  if (nranks > kShmMaxRanks) return fail(kInvalidArgument, "the cross-process fake NCCL has at most 8 ranks");
  auto seg = std::make_unique<ShmSegment>();
  seg->nranks = nranks;
  seg->size = kShmHeaderBytes + kShmSlotBytes * nranks;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return fail(kInvalidUsage, "shm_open " + name + ": " + std::strerror(errno));
  struct stat st {};
  bool ok = fstat(fd, &st) == 0 && (static_cast<size_t>(st.st_size) >= seg->size || ftruncate(fd, seg->size) == 0);
  if (ok) {
    void* base = mmap(nullptr, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ok = base != MAP_FAILED;
    if (ok) seg->base = base;
  }
  close(fd);
  if (!ok) return fail(kInvalidUsage, "mapping " + name + ": " + std::strerror(errno));
  ShmHeader& h = *seg->header();
  int32_t expected = 0;
  if (!h.nranks.compare_exchange_strong(expected, nranks) && expected != nranks) {
    return fail(kInvalidUsage, "ranks disagree on nranks");
  }
  expected = 0;
  if (!h.pids[comm->rank].compare_exchange_strong(expected, static_cast<int32_t>(getpid()))) {
    return fail(kInvalidUsage, "rank " + std::to_string(comm->rank) + " joined twice");
  }
  comm->shm = std::move(seg);
  const bool joined = shm_wait(
      comm,
      [&] {
        for (int r = 0; r < nranks; ++r) {
          if (h.pids[r].load() == 0) return false;
        }
        return true;
      },
      /*until_error=*/true);
  if (!joined) {
    shm_unlink(name.c_str());
    return fail(kRemoteError, "a rank of " + name + " died or never joined");
  }
  shm_unlink(name.c_str());  // every rank mapped it: the name is no longer needed
  return kSuccess;
}

int comm_init_rank(void** comm_out, int nranks, const void* id, int rank) {
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    std::shared_ptr<Clique>& slot = g_cliques[key_of(id)];
    if (slot == nullptr) {
      slot = std::make_shared<Clique>();
      slot->nranks = nranks;
      std::lock_guard<std::mutex> clique_lock(slot->mu);
      slot->comms.assign(nranks, nullptr);
    }
    clique = slot;
  }
  if (clique->nranks != nranks) return fail(kInvalidUsage, "ranks disagree on nranks");
  auto* comm = new Comm();
  comm->clique = clique;
  comm->rank = rank;
  std::unique_lock<std::mutex> lock(clique->mu);
  if (clique->comms[rank] != nullptr) {
    delete comm;
    return fail(kInvalidUsage, "rank " + std::to_string(rank) + " joined twice");
  }
  clique->comms[rank] = comm;
  ++g_live_comms;
  ++clique->joined;
  clique->cv.notify_all();
  if (std::strncmp(static_cast<const char*>(id), kShmIdPrefix, sizeof(kShmIdPrefix) - 1) == 0) {
    lock.unlock();
    if (int result = join_segment(comm, nranks, id); result != kSuccess) {
      std::string why = t_last_error;
      comm_end(comm, true);
      return fail(result, std::move(why));
    }
    *comm_out = comm;
    return kSuccess;
  }
  clique->cv.wait(lock, [&] { return clique->joined == nranks; });  // init is collective
  *comm_out = comm;
  return kSuccess;
}

// Destroy waits for the comm's work; abort first ends what is blocked.
int comm_end(void* comm_handle, bool abort) {
  Comm* comm = static_cast<Comm*>(comm_handle);
  Clique& c = *comm->clique;
  {
    std::unique_lock<std::mutex> lock(c.mu);
    if (abort) comm->aborted = true;
    c.cv.notify_all();
    c.cv.wait(lock, [&] { return comm->inflight == 0; });
    c.comms[comm->rank] = nullptr;
  }
  --g_live_comms;
  delete comm;
  return kSuccess;
}
int comm_destroy(void* comm) { return comm_end(comm, false); }
int comm_abort(void* comm) { return comm_end(comm, true); }

int comm_get_async_error(void* comm_handle, int* async_error) {
  Comm* comm = static_cast<Comm*>(comm_handle);
  std::lock_guard<std::mutex> lock(comm->clique->mu);
  *async_error = comm->async_error;
  return kSuccess;
}

int all_reduce(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kAllReduce, send, recv, count, dtype, op, 0, 0});
}
int broadcast(const void* send, void* recv, size_t count, int dtype, int root, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kBroadcast, send, recv, count, dtype, 0, root, 0});
}
int all_gather(const void* send, void* recv, size_t count, int dtype, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kAllGather, send, recv, count, dtype, 0, 0, 0});
}
int reduce_scatter(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kReduceScatter, send, recv, count, dtype, op, 0, 0});
}
int send(const void* buf, size_t count, int dtype, int peer, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kSend, buf, nullptr, count, dtype, 0, peer, 0});
}
int recv(void* buf, size_t count, int dtype, int peer, void* comm, void* stream) {
  return submit(comm, stream, Op{Kind::kRecv, nullptr, buf, count, dtype, 0, peer, 0});
}

int group_start() {
  ++t_group_depth;
  return kSuccess;
}

// The outermost end launches the group: one task per (comm, stream).
int group_end() {
  if (t_group_depth == 0) return fail(kInvalidUsage, "group end without group start");
  if (--t_group_depth > 0) return kSuccess;
  std::vector<Pending> pending = std::move(t_pending);
  t_pending.clear();
  std::vector<std::pair<std::pair<Comm*, void*>, std::vector<Op>>> fused;
  for (const Pending& p : pending) {
    auto it = fused.begin();
    while (it != fused.end() && it->first != std::make_pair(p.comm, p.stream)) ++it;
    if (it == fused.end()) it = fused.insert(fused.end(), {{p.comm, p.stream}, {}});
    it->second.push_back(p.op);
  }
  for (auto& [target, ops] : fused) enqueue(target.first, target.second, std::move(ops));
  return kSuccess;
}

const char* get_error_string(int result) {
  switch (result) {
    case kSuccess: return "no error";
    case kInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case kInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case kRemoteError: return "remote process exited or there was a network error";
    default: return "unhandled error";
  }
}
const char* get_last_error(void*) { return t_last_error.c_str(); }

const te_nccl_ops kFakeNccl = {
    get_version, get_unique_id, comm_init_rank, comm_destroy, comm_abort, comm_get_async_error,
    all_reduce,  broadcast,     all_gather,     reduce_scatter, send,     recv,
    group_start, group_end,     get_error_string, get_last_error,
};

}  // namespace

const te_nccl_ops* FakeNccl::ops() { return &kFakeNccl; }

int FakeNccl::load(const char*, te_nccl_ops* ops, char*, size_t) {
  *ops = kFakeNccl;
  return 0;
}

int64_t FakeNccl::live_comms() { return g_live_comms.load(); }

void FakeNccl::kill_rank_everywhere(int rank) {
  std::vector<std::shared_ptr<Clique>> cliques;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    for (const auto& [key, clique] : g_cliques) cliques.push_back(clique);
  }
  for (const std::shared_ptr<Clique>& clique : cliques) {
    std::lock_guard<std::mutex> lock(clique->mu);
    for (Comm* comm : clique->comms) {
      if (comm != nullptr && comm->rank != rank) comm->async_error = kRemoteError;
    }
  }
}

void FakeNccl::kill_rank(const castmesh_te_unique_id_v1& id, int rank) {
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = g_cliques.find(key_of(id.bytes));
    if (it == g_cliques.end()) return;
    clique = it->second;
  }
  std::lock_guard<std::mutex> lock(clique->mu);
  for (Comm* comm : clique->comms) {
    if (comm != nullptr && comm->rank != rank) comm->async_error = kRemoteError;
  }
}

}  // namespace castmesh::fakes
