#include "core/rdma/ibverbs_path.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/backend.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/rdma/service.h"
#include "core/progress/progress_engine.h"

namespace castmesh::rdma {
namespace {

namespace v1 = wire::v1;

// Bytes per work request: the smallest max message size of common ports
// (the backend refuses a longer one with INVALID_ARGUMENT).
constexpr uint64_t kMaxMessage = uint64_t{1} << 30;
constexpr uint32_t kSendQueueDepth = 128;
constexpr uint32_t kPollBatch = 32;
// A peer that does not answer CONNECT within this is treated as socket-only.
constexpr auto kConnectTimeout = std::chrono::seconds(10);
// The poller's sleep while operations are in flight but nothing completed:
// doubles from kMinIdle up to kMaxIdle (see docs/rdma.md).
constexpr auto kMinIdle = std::chrono::microseconds(20);
constexpr auto kMaxIdle = std::chrono::microseconds(1000);

absl::StatusCode code_of(int32_t status) {
  switch (status) {
    case CASTMESH_STATUS_OK: return absl::StatusCode::kOk;
    case CASTMESH_STATUS_INVALID_ARGUMENT: return absl::StatusCode::kInvalidArgument;
    case CASTMESH_STATUS_UNIMPLEMENTED: return absl::StatusCode::kUnimplemented;
    case CASTMESH_STATUS_RESOURCE_EXHAUSTED: return absl::StatusCode::kResourceExhausted;
    case CASTMESH_STATUS_FAILED_PRECONDITION: return absl::StatusCode::kFailedPrecondition;
    case CASTMESH_STATUS_PERMISSION_DENIED: return absl::StatusCode::kPermissionDenied;
    case CASTMESH_STATUS_NO_DRIVER:
    case CASTMESH_STATUS_NO_DEVICE:
    case CASTMESH_STATUS_UNAVAILABLE: return absl::StatusCode::kUnavailable;
    case CASTMESH_STATUS_ABORTED: return absl::StatusCode::kAborted;
    default: return absl::StatusCode::kInternal;
  }
}

absl::Status status_of(int32_t status, const castmesh_error_v1& error) {
  return absl::Status(code_of(status), error.message);
}

bool is_finished(const std::shared_ptr<Transfer>& transfer) {
  detail::MutexLock lock(transfer->mu);
  return transfer->finished;
}

// One operation whose work requests the NIC holds.
// One operation with its local memory registered: waiting to be posted, or
// whose work requests the NIC holds.
struct InFlight {
  std::shared_ptr<Transfer> transfer;
  std::unique_ptr<char[]> bounce;  // reads, and writes from memory without an owner
  char* local = nullptr;           // what the NIC reads or writes: the bounce region or the source
  uint64_t mr = 0;                 // its registration
  uint32_t lkey = 0;
};

// This process's endpoint towards one peer (it starts the operations).
struct Pair {
  enum class Phase { kConnecting, kReady };
  Phase phase = Phase::kConnecting;
  uint64_t endpoint = 0;
  uint64_t connect_id = 0;
  std::chrono::steady_clock::time_point connect_started;
  std::weak_ptr<proc::ProcHost> host;
  std::vector<InFlight> waiting;  // connecting, or the send queue was full
  absl::flat_hash_map<uint64_t, InFlight> in_flight;  // by wr_id
};

// A finished operation to report outside the lock.
struct Outcome {
  std::shared_ptr<Transfer> transfer;
  absl::Status status;
  std::unique_ptr<char[]> bounce;  // a read's bytes, when status is OK
};

}  // namespace

struct IbverbsPath::State {
  std::once_flag opened;
  const castmesh_rdma_table_v1* table = nullptr;
  castmesh_rdma_device_v1* device = nullptr;
  std::string why_not;  // set once by open(), read after call_once
  std::atomic<bool> ready{false};  // open() found a NIC

  detail::Mutex mu;
  detail::CondVar wake;
  uint64_t next_wr ABSL_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<ProcId, std::unique_ptr<Pair>> pairs ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<ProcId, uint64_t> passive ABSL_GUARDED_BY(mu);  // endpoints peers connected to us
  absl::flat_hash_map<ProcId, std::string> socket_only ABSL_GUARDED_BY(mu);  // peer -> why
  bool poller_started ABSL_GUARDED_BY(mu) = false;
  // The proc that talks to the peers (the latest seen; one per process in practice).
  std::weak_ptr<proc::ProcHost> host ABSL_GUARDED_BY(mu);

  // Owner side: released buffers whose NIC registration (and memory) waits
  // for the DRAINED of every peer connected when they were released.
  struct Draining {
    std::shared_ptr<const Registration> registration;
    absl::flat_hash_set<ProcId> waiting;
  };
  absl::flat_hash_map<uint64_t, Draining> draining ABSL_GUARDED_BY(mu);
  // Requester side: (owner, buffer) its owner released; nothing new is posted on them.
  absl::flat_hash_set<std::pair<ProcId, uint64_t>> released ABSL_GUARDED_BY(mu);
  // Requester side: buffers per owner whose RELEASING waits for their operations here.
  absl::flat_hash_map<ProcId, absl::flat_hash_set<uint64_t>> drains ABSL_GUARDED_BY(mu);
  // DRAINED answers to send once the lock is released.
  std::vector<std::pair<ProcId, uint64_t>> drained_to_send ABSL_GUARDED_BY(mu);

  void open();
  void destroy_endpoint(uint64_t endpoint);
  absl::StatusOr<InFlight> prepare(std::shared_ptr<Transfer> transfer);
  void drop(InFlight& op);
  void post(Pair& pair, const ProcId& peer, InFlight op, std::vector<Outcome>* outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void fail_pair(const ProcId& peer, const absl::Status& why, bool socket_only, std::vector<Outcome>* outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool poll_pair(const ProcId& peer, Pair& pair, std::vector<Outcome>* outcomes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void poll_loop();
  void ensure_poller() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void check_drains(const ProcId& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void flush_drained() ABSL_LOCKS_EXCLUDED(mu);
  std::shared_ptr<const Registration> stop_waiting(uint64_t buffer, const ProcId& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

namespace {

// A waiting operation whose connection failed while others were posted.
Outcome connection_gone(std::shared_ptr<Transfer> transfer) {
  std::string owner = transfer->remote.owner;
  return Outcome{std::move(transfer),
                 absl::AbortedError(absl::StrCat("the ibverbs connection to proc ", owner, " failed")), nullptr};
}

void report(std::vector<Outcome>& outcomes) {
  for (Outcome& outcome : outcomes) {
    Transfer& t = *outcome.transfer;
    if (!outcome.status.ok()) {
      Transfers::instance().finish(outcome.transfer, outcome.status);
    } else if (!t.write) {
      // Copied under the transfer's lock, only while it is pending: a read
      // that already timed out gets nothing.
      Transfers::instance().deliver(outcome.transfer, t.offset, outcome.bounce.get(), t.length);
    } else {
      Transfers::instance().finish(outcome.transfer, RdmaResult{t.length, RdmaTransport::kIbverbs});
    }
  }
  outcomes.clear();
}

void send_header(const std::weak_ptr<proc::ProcHost>& weak, const ProcId& peer, const v1::RdmaHeader& header,
                 absl::Status* sent) {
  std::shared_ptr<proc::ProcHost> host = weak.lock();
  *sent = host == nullptr ? absl::UnavailableError("this proc's transport is shut down")
                          : host->send_data(peer, kRdmaDataType, header.SerializeAsString(), {});
}

}  // namespace

namespace {

// Whether an operation on `buffer` waits in `pair` or is on the NIC.
bool uses_buffer(const Pair& pair, uint64_t buffer) {
  auto on = [buffer](const InFlight& op) { return op.transfer != nullptr && op.transfer->remote.id == buffer; };
  return std::any_of(pair.waiting.begin(), pair.waiting.end(), on) ||
         std::any_of(pair.in_flight.begin(), pair.in_flight.end(), [&](const auto& entry) { return on(entry.second); });
}

v1::RdmaHeader buffer_header(v1::RdmaHeader::Kind kind, uint64_t buffer) {
  v1::RdmaHeader header;
  header.set_kind(kind);
  header.set_buffer(buffer);
  return header;
}

}  // namespace

void IbverbsPath::State::check_drains(const ProcId& peer) {
  auto it = drains.find(peer);
  if (it == drains.end()) return;
  auto pair = pairs.find(peer);
  for (auto buffer = it->second.begin(); buffer != it->second.end();) {
    if (pair != pairs.end() && uses_buffer(*pair->second, *buffer)) {
      ++buffer;
      continue;
    }
    drained_to_send.emplace_back(peer, *buffer);
    it->second.erase(buffer++);
  }
  if (it->second.empty()) drains.erase(it);
}

void IbverbsPath::State::flush_drained() {
  std::vector<std::pair<ProcId, uint64_t>> out;
  std::weak_ptr<proc::ProcHost> weak;
  {
    detail::MutexLock lock(mu);
    out.swap(drained_to_send);
    weak = host;
  }
  for (const auto& [peer, buffer] : out) {
    absl::Status ignored;  // a lost owner no longer waits
    send_header(weak, peer, buffer_header(v1::RdmaHeader::DRAINED, buffer), &ignored);
  }
}

std::shared_ptr<const Registration> IbverbsPath::State::stop_waiting(uint64_t buffer, const ProcId& peer) {
  auto it = draining.find(buffer);
  if (it == draining.end()) return nullptr;
  it->second.waiting.erase(peer);
  if (!it->second.waiting.empty()) return nullptr;
  std::shared_ptr<const Registration> done = std::move(it->second.registration);
  draining.erase(it);
  return done;  // the caller drops it after the lock: deregistering may free user memory
}

void IbverbsPath::State::open() {
  absl::StatusOr<const Backend*> backend = load_backend("rdma");
  if (!backend.ok()) {
    why_not = absl::StrCat("no RDMA NIC: ", backend.status().message());
    return;
  }
  const castmesh_rdma_table_v1* found = rdma_table(**backend);
  if (found == nullptr) {
    why_not = absl::StrCat("the rdma backend at ", (*backend)->info().path,
                           " has no one-sided RDMA table (backend ABI 1.0?); upgrade castmesh[rdma]");
    return;
  }
  const config::Config& settings = config::global();
  const char* name = settings.rdma_device.empty() ? nullptr : settings.rdma_device.c_str();
  castmesh_error_v1 error{};
  castmesh_rdma_device_v1* opened = nullptr;
  const int32_t status =
      found->open_device(name, settings.rdma_port, settings.rdma_gid_index, &opened, &error);
  if (status != CASTMESH_STATUS_OK) {
    why_not = absl::StrCat("the rdma backend could not open ", name != nullptr && *name ? name : "a NIC", ": ",
                           error.message);
    return;
  }
  table = found;
  device = opened;
  ready.store(true);
}

void IbverbsPath::State::destroy_endpoint(uint64_t endpoint) {
  castmesh_error_v1 error{};
  // Once this returns, the NIC no longer works on the endpoint's requests.
  if (table->destroy_endpoint(device, endpoint, &error) != CASTMESH_STATUS_OK) {
    CASTMESH_LOG_WARN("castmesh-rdma: destroying an ibverbs endpoint failed: {}", error.message);
  }
}

void IbverbsPath::State::ensure_poller() {
  if (poller_started) return;
  poller_started = true;
  progress::ProgressEngine::instance().start_service("castmesh-ibverbs", [this] { poll_loop(); });
}

void IbverbsPath::State::fail_pair(const ProcId& peer, const absl::Status& why, bool mark_socket_only,
                                   std::vector<Outcome>* outcomes) {
  auto it = pairs.find(peer);
  if (it == pairs.end()) return;
  std::unique_ptr<Pair> pair = std::move(it->second);
  pairs.erase(it);
  if (pair->endpoint != 0) destroy_endpoint(pair->endpoint);  // before any bounce region goes
  for (InFlight& op : pair->waiting) {
    drop(op);
    outcomes->push_back(Outcome{std::move(op.transfer), why, nullptr});
  }
  for (auto& [wr_id, op] : pair->in_flight) {
    drop(op);
    outcomes->push_back(Outcome{std::move(op.transfer), why, nullptr});
  }
  if (mark_socket_only && socket_only.try_emplace(peer, std::string(why.message())).second) {
    CASTMESH_LOG_INFO("castmesh-rdma: {}; RDMA buffers of proc {} use the other transports from now on",
                      std::string(why.message()), peer);
  }
  check_drains(peer);  // the destroyed endpoint holds no work request any more
}

absl::StatusOr<InFlight> IbverbsPath::State::prepare(std::shared_ptr<Transfer> transfer) {
  InFlight op;
  op.local = transfer->bytes;
  if (!transfer->write || transfer->local.owner() == nullptr) {
    // Reads always land in a bounce region (see docs/rdma.md: no late byte);
    // a borrowed source is copied, as its caller may free it after a timeout.
    op.bounce.reset(new char[std::max<size_t>(transfer->length, 1)]);
    if (transfer->write && transfer->length > 0) std::memcpy(op.bounce.get(), transfer->bytes, transfer->length);
    op.local = op.bounce.get();
  }
  castmesh_rdma_mr_info_v1 info{};
  info.struct_size = sizeof info;
  castmesh_error_v1 error{};
  const uint32_t access = transfer->write ? 0 : CASTMESH_RDMA_ACCESS_LOCAL_WRITE;
  const int32_t status =
      table->register_memory(device, op.local, std::max<uint64_t>(transfer->length, 1), access, &info, &error);
  if (status != CASTMESH_STATUS_OK) return status_of(status, error);
  op.mr = info.handle;
  op.lkey = info.lkey;
  op.transfer = std::move(transfer);
  return op;
}

void IbverbsPath::State::drop(InFlight& op) {
  castmesh_error_v1 ignored{};
  if (op.mr != 0) (void)table->deregister_memory(device, op.mr, &ignored);
  op.mr = 0;
}

void IbverbsPath::State::post(Pair& pair, const ProcId& peer, InFlight op, std::vector<Outcome>* outcomes) {
  Transfer& transfer = *op.transfer;
  if (is_finished(op.transfer)) return drop(op);  // timed out while it waited
  const uint64_t wr_id = next_wr++;
  std::vector<castmesh_rdma_op_v1> ops;
  uint64_t at = 0;
  do {
    const uint64_t n = std::min(kMaxMessage, transfer.length - at);
    castmesh_rdma_op_v1 wr{};
    wr.wr_id = wr_id;
    wr.opcode = transfer.write ? CASTMESH_RDMA_OP_WRITE : CASTMESH_RDMA_OP_READ;
    wr.local_addr = reinterpret_cast<uint64_t>(op.local) + at;
    wr.remote_addr = transfer.remote.nic_address + transfer.offset + at;
    wr.length = n;
    wr.lkey = op.lkey;
    wr.rkey = transfer.remote.rkey;
    ops.push_back(wr);
    at += n;
  } while (at < transfer.length);
  uint32_t posted = 0;
  castmesh_error_v1 error{};
  const int32_t status =
      table->post(device, pair.endpoint, ops.data(), static_cast<uint32_t>(ops.size()), &posted, &error);
  if (status == CASTMESH_STATUS_OK) {
    pair.in_flight.emplace(wr_id, std::move(op));
    wake.notify_one();
    return;
  }
  if (posted > 0) {  // the NIC holds part of it: the endpoint failed; keep the memory until it is destroyed
    pair.in_flight.emplace(wr_id, std::move(op));
    return fail_pair(peer, status_of(status, error), false, outcomes);
  }
  if (status == CASTMESH_STATUS_RESOURCE_EXHAUSTED) {
    pair.waiting.push_back(std::move(op));  // posted again once completions free the queue
    return;
  }
  drop(op);
  outcomes->push_back(Outcome{std::move(op.transfer), status_of(status, error), nullptr});
  if (status == CASTMESH_STATUS_FAILED_PRECONDITION) {  // the endpoint failed earlier: reconnect next time
    fail_pair(peer, absl::AbortedError(absl::StrCat("the ibverbs connection to proc ", peer, " failed: ",
                                                    error.message)),
              false, outcomes);
  }
}

bool IbverbsPath::State::poll_pair(const ProcId& peer, Pair& pair, std::vector<Outcome>* outcomes) {
  castmesh_rdma_completion_v1 completions[kPollBatch];
  uint32_t count = 0;
  castmesh_error_v1 error{};
  if (table->poll(device, pair.endpoint, completions, kPollBatch, &count, &error) != CASTMESH_STATUS_OK) {
    fail_pair(peer, absl::UnavailableError(absl::StrCat("polling the ibverbs connection to proc ", peer,
                                                        " failed: ", error.message)),
              false, outcomes);
    return true;
  }
  std::optional<Outcome> failed;
  for (uint32_t i = 0; i < count; ++i) {
    const castmesh_rdma_completion_v1& c = completions[i];
    auto it = pair.in_flight.find(c.wr_id);
    if (it == pair.in_flight.end()) continue;  // a flushed chunk of an operation already reported
    if (c.status != CASTMESH_STATUS_OK) {
      if (failed) continue;
      absl::Status why(code_of(c.status), c.message);
      if (c.status == CASTMESH_STATUS_PERMISSION_DENIED) {
        // The handle's range and access were checked before posting: the
        // owner's NIC no longer knows the key, i.e. the buffer was released.
        why = absl::FailedPreconditionError(absl::StrCat("RDMA buffer of proc ", peer,
                                                         " was released (its NIC refused the key: ", c.message, ")"));
      }
      failed = Outcome{it->second.transfer, why, nullptr};
      continue;
    }
    // Only the last chunk is signalled; on RC it completes after the others.
    InFlight op = std::move(it->second);
    pair.in_flight.erase(it);
    drop(op);
    outcomes->push_back(Outcome{std::move(op.transfer), absl::OkStatus(), std::move(op.bounce)});
  }
  if (failed) {
    // A failed completion leaves the endpoint failed: destroy it (the other
    // operations on it fail) and connect a new one on the next operation.
    const std::string message(failed->status.message());
    outcomes->push_back(std::move(*failed));
    fail_pair(peer, absl::AbortedError(absl::StrCat("an earlier operation on the ibverbs connection to proc ", peer,
                                                    " failed: ", message)),
              false, outcomes);
  }
  check_drains(peer);
  return count > 0;
}

void IbverbsPath::State::poll_loop() {
  auto idle = kMinIdle;
  std::vector<Outcome> outcomes;
  while (true) {
    bool progress = false;
    {
      detail::MutexLock lock(mu);
      bool busy = false;
      bool connecting = false;
      for (const auto& [peer, pair] : pairs) {
        busy = busy || !pair->in_flight.empty();
        connecting = connecting || pair->phase == Pair::Phase::kConnecting;
      }
      if (!busy) {
        idle = kMinIdle;
        if (connecting) wake.wait_for(lock, absl::Milliseconds(100));
        else wake.wait(lock);
      }
      std::vector<ProcId> peers;
      for (const auto& [peer, pair] : pairs) peers.push_back(peer);
      const auto now = std::chrono::steady_clock::now();
      for (const ProcId& peer : peers) {
        auto it = pairs.find(peer);
        if (it == pairs.end()) continue;
        Pair& pair = *it->second;
        if (pair.phase == Pair::Phase::kConnecting) {
          if (now - pair.connect_started > kConnectTimeout) {
            fail_pair(peer, absl::UnavailableError(absl::StrCat("proc ", peer, " did not answer the ibverbs CONNECT")),
                      true, &outcomes);
          }
          continue;
        }
        if (pair.in_flight.empty() && pair.waiting.empty()) continue;
        progress = poll_pair(peer, pair, &outcomes) || progress;
        it = pairs.find(peer);
        if (it == pairs.end() || it->second->waiting.empty()) continue;
        std::vector<InFlight> retry = std::move(it->second->waiting);
        it->second->waiting.clear();
        for (InFlight& op : retry) {
          it = pairs.find(peer);
          if (it == pairs.end()) {
            drop(op);
            outcomes.push_back(connection_gone(std::move(op.transfer)));
            continue;
          }
          post(*it->second, peer, std::move(op), &outcomes);
        }
      }
    }
    progress = progress || !outcomes.empty();
    report(outcomes);
    flush_drained();
    if (progress) {
      idle = kMinIdle;
    } else {
      std::this_thread::sleep_for(idle);
      idle = std::min<std::chrono::microseconds>(idle * 2, kMaxIdle);
    }
  }
}

IbverbsPath::IbverbsPath() : state_(new State) {}

IbverbsPath& IbverbsPath::instance() {
  static auto* path = new IbverbsPath;
  return *path;
}

bool IbverbsPath::usable() {
  std::call_once(state_->opened, [this] { state_->open(); });
  return state_->device != nullptr;
}

std::string IbverbsPath::why_not() { return usable() ? std::string() : state_->why_not; }

bool IbverbsPath::reachable(const ProcId& peer) {
  if (!usable()) return false;
  detail::MutexLock lock(state_->mu);
  return !state_->socket_only.contains(peer);
}

std::string IbverbsPath::why_unreachable(const ProcId& peer) {
  if (!usable()) return state_->why_not;
  detail::MutexLock lock(state_->mu);
  auto it = state_->socket_only.find(peer);
  return it == state_->socket_only.end() ? std::string() : it->second;
}

absl::StatusOr<NicRange> IbverbsPath::register_range(void* base, size_t size, RdmaAccess access) {
  if (!usable()) return absl::FailedPreconditionError(state_->why_not);
  uint32_t bits = 0;
  if ((static_cast<uint32_t>(access) & static_cast<uint32_t>(RdmaAccess::kRead)) != 0) {
    bits |= CASTMESH_RDMA_ACCESS_REMOTE_READ;
  }
  if ((static_cast<uint32_t>(access) & static_cast<uint32_t>(RdmaAccess::kWrite)) != 0) {
    bits |= CASTMESH_RDMA_ACCESS_REMOTE_WRITE | CASTMESH_RDMA_ACCESS_LOCAL_WRITE;
  }
  castmesh_rdma_mr_info_v1 info{};
  info.struct_size = sizeof info;
  castmesh_error_v1 error{};
  const int32_t status = state_->table->register_memory(state_->device, base, size, bits, &info, &error);
  if (status != CASTMESH_STATUS_OK) return status_of(status, error);
  State* state = state_;
  const uint64_t handle = info.handle;
  // The handle names the range's own address: the cache may hand back a
  // wider registration, whose rkey covers it.
  std::shared_ptr<void> registration(reinterpret_cast<void*>(handle), [state, handle](void*) {
    castmesh_error_v1 ignored{};
    (void)state->table->deregister_memory(state->device, handle, &ignored);
  });
  return NicRange{std::move(registration), info.rkey};
}

namespace {

absl::Status released_error(const Transfer& transfer) {
  return absl::FailedPreconditionError(
      absl::StrCat("RDMA buffer ", transfer.remote.id, " of proc ", transfer.remote.owner, " was released"));
}

}  // namespace

void IbverbsPath::start(const std::shared_ptr<Transfer>& transfer) {
  const auto key = std::make_pair(transfer->remote.owner, transfer->remote.id);
  {
    detail::MutexLock lock(state_->mu);
    if (state_->released.contains(key)) {
      lock.unlock();
      return Transfers::instance().finish(transfer, released_error(*transfer));
    }
  }
  // Copying a borrowed source and registering with the NIC (which pins
  // pages) run here, on the caller's thread, outside the lock.
  absl::StatusOr<InFlight> prepared = state_->prepare(transfer);
  if (!prepared.ok()) return Transfers::instance().finish(transfer, prepared.status());
  std::vector<Outcome> outcomes;
  v1::RdmaHeader connect;
  std::weak_ptr<proc::ProcHost> host;
  {
    detail::MutexLock lock(state_->mu);
    state_->host = transfer->host;
    // Checked again under the lock that RELEASING takes: either this
    // operation is counted by the drain, or it sees the release.
    if (state_->released.contains(key)) {
      state_->drop(*prepared);
      outcomes.push_back(Outcome{transfer, released_error(*transfer), nullptr});
      lock.unlock();
      return report(outcomes);
    }
    state_->ensure_poller();
    auto [it, fresh] = state_->pairs.try_emplace(transfer->remote.owner);
    if (fresh) {
      it->second = std::make_unique<Pair>();
      Pair& pair = *it->second;
      uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
      castmesh_error_v1 error{};
      const int32_t status =
          state_->table->create_endpoint(state_->device, kSendQueueDepth, &pair.endpoint, blob, &error);
      pair.waiting.push_back(*std::move(prepared));
      if (status != CASTMESH_STATUS_OK) {
        pair.endpoint = 0;
        state_->fail_pair(transfer->remote.owner,
                          absl::UnavailableError(absl::StrCat("creating an ibverbs endpoint for proc ",
                                                              transfer->remote.owner, " failed: ", error.message)),
                          true, &outcomes);
      } else {
        pair.connect_id = Transfers::instance().next_id();
        pair.connect_started = std::chrono::steady_clock::now();
        pair.host = transfer->host;
        connect.set_kind(v1::RdmaHeader::CONNECT);
        connect.set_op(pair.connect_id);
        connect.set_blob(blob, sizeof blob);
        host = transfer->host;
        state_->wake.notify_one();
      }
    } else if (it->second->phase == Pair::Phase::kConnecting) {
      it->second->waiting.push_back(*std::move(prepared));
    } else {
      state_->post(*it->second, transfer->remote.owner, *std::move(prepared), &outcomes);
    }
  }
  if (connect.kind() == v1::RdmaHeader::CONNECT) {
    absl::Status sent;
    send_header(host, transfer->remote.owner, connect, &sent);
    if (!sent.ok()) {
      detail::MutexLock lock(state_->mu);
      state_->fail_pair(transfer->remote.owner, sent, false, &outcomes);
    }
  }
  report(outcomes);
}

void IbverbsPath::on_connect(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  v1::RdmaHeader answer;
  answer.set_kind(v1::RdmaHeader::CONNECTED);
  answer.set_op(header.op());
  absl::Status made;
  if (!usable()) {
    made = absl::FailedPreconditionError(absl::StrCat("proc ", host.id(), " has no ibverbs path: ", why_not()));
  } else {
    detail::MutexLock lock(state_->mu);
    // A new CONNECT replaces the peer's earlier endpoint: the peer gave it up.
    if (auto it = state_->passive.find(peer); it != state_->passive.end()) {
      state_->destroy_endpoint(it->second);
      state_->passive.erase(it);
    }
    uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
    uint64_t endpoint = 0;
    castmesh_error_v1 error{};
    int32_t status = state_->table->create_endpoint(state_->device, kSendQueueDepth, &endpoint, blob, &error);
    if (status == CASTMESH_STATUS_OK) {
      status = state_->table->connect_endpoint(state_->device, endpoint,
                                               reinterpret_cast<const uint8_t*>(header.blob().data()),
                                               header.blob().size(), &error);
      if (status != CASTMESH_STATUS_OK) state_->destroy_endpoint(endpoint);
    }
    if (status == CASTMESH_STATUS_OK) {
      state_->passive[peer] = endpoint;
      answer.set_blob(blob, sizeof blob);
    } else {
      made = status_of(status, error);
    }
  }
  if (!made.ok()) {
    answer.set_error_code(static_cast<int32_t>(made.code()));
    answer.set_error_message(std::string(made.message()));
  }
  (void)host.send_data(peer, kRdmaDataType, answer.SerializeAsString(), {});  // a lost peer needs no answer
  if (!made.ok()) return;
  // Buffers released while they drain are still registered: this new peer
  // must hear of the release too, and be waited for.
  std::vector<uint64_t> releasing;
  {
    detail::MutexLock lock(state_->mu);
    state_->host = host.weak_from_this();
    for (auto& [buffer, entry] : state_->draining) {
      entry.waiting.insert(peer);
      releasing.push_back(buffer);
    }
  }
  for (uint64_t buffer : releasing) {
    (void)host.send_data(peer, kRdmaDataType, buffer_header(v1::RdmaHeader::RELEASING, buffer).SerializeAsString(), {});
  }
}

void IbverbsPath::on_connected(const ProcId& peer, const v1::RdmaHeader& header) {
  std::vector<Outcome> outcomes;
  {
    detail::MutexLock lock(state_->mu);
    auto it = state_->pairs.find(peer);
    if (it == state_->pairs.end() || it->second->phase != Pair::Phase::kConnecting ||
        it->second->connect_id != header.op()) {
      return;  // an answer to a connection given up meanwhile
    }
    Pair& pair = *it->second;
    absl::Status connected;
    if (header.error_code() != 0) {
      connected = absl::Status(static_cast<absl::StatusCode>(std::clamp(header.error_code(), 1, 16)),
                               header.error_message());
    } else {
      castmesh_error_v1 error{};
      const int32_t status = state_->table->connect_endpoint(
          state_->device, pair.endpoint, reinterpret_cast<const uint8_t*>(header.blob().data()),
          header.blob().size(), &error);
      if (status != CASTMESH_STATUS_OK) connected = status_of(status, error);
    }
    if (!connected.ok()) {
      state_->fail_pair(peer,
                        absl::UnavailableError(absl::StrCat("the ibverbs connection to proc ", peer,
                                                            " failed: ", connected.message())),
                        true, &outcomes);
    } else {
      pair.phase = Pair::Phase::kReady;
      std::vector<InFlight> waiting = std::move(pair.waiting);
      pair.waiting.clear();
      for (InFlight& op : waiting) {
        auto found = state_->pairs.find(peer);
        if (found == state_->pairs.end()) {
          state_->drop(op);
          outcomes.push_back(connection_gone(std::move(op.transfer)));
          continue;
        }
        state_->post(*found->second, peer, std::move(op), &outcomes);
      }
    }
    state_->check_drains(peer);
  }
  report(outcomes);
  state_->flush_drained();
}

void IbverbsPath::peer_lost(const ProcId& peer) {
  std::vector<Outcome> outcomes;
  std::vector<std::shared_ptr<const Registration>> retired;  // dropped after the lock
  {
    if (!state_->ready.load()) return;  // never opened a NIC: nothing to tear down
    detail::MutexLock lock(state_->mu);
    state_->fail_pair(peer, absl::UnavailableError(absl::StrCat("proc ", peer, " was lost")), false, &outcomes);
    auto it = state_->passive.find(peer);
    if (it != state_->passive.end()) {
      state_->destroy_endpoint(it->second);
      state_->passive.erase(it);
    }
    std::vector<uint64_t> buffers;
    for (const auto& [buffer, entry] : state_->draining) buffers.push_back(buffer);
    for (uint64_t buffer : buffers) {
      if (auto done = state_->stop_waiting(buffer, peer)) retired.push_back(std::move(done));
    }
    state_->drains.erase(peer);
    absl::erase_if(state_->released, [&peer](const auto& key) { return key.first == peer; });
  }
  report(outcomes);
  state_->flush_drained();
}

void IbverbsPath::retire(std::shared_ptr<const Registration> registration, proc::ProcHost* host) {
  if (registration == nullptr || registration->nic == nullptr || !state_->ready.load()) return;
  std::vector<ProcId> peers;
  std::weak_ptr<proc::ProcHost> weak;
  {
    detail::MutexLock lock(state_->mu);
    weak = host != nullptr ? host->weak_from_this() : state_->host;
    for (const auto& [peer, endpoint] : state_->passive) peers.push_back(peer);
    if (peers.empty() || weak.expired()) return;  // no peer can have posted on it
    State::Draining& entry = state_->draining[registration->id];
    entry.registration = registration;
    entry.waiting.insert(peers.begin(), peers.end());
  }
  for (const ProcId& peer : peers) {
    absl::Status sent;
    send_header(weak, peer, buffer_header(v1::RdmaHeader::RELEASING, registration->id), &sent);
    if (!sent.ok()) {  // gone: it has nothing in flight to wait for
      std::shared_ptr<const Registration> done;
      detail::MutexLock lock(state_->mu);
      done = state_->stop_waiting(registration->id, peer);
    }
  }
}

void IbverbsPath::on_releasing(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  {
    detail::MutexLock lock(state_->mu);
    state_->host = host.weak_from_this();
    state_->released.insert(std::make_pair(peer, header.buffer()));
    state_->drains[peer].insert(header.buffer());
    state_->check_drains(peer);
  }
  state_->flush_drained();
}

void IbverbsPath::on_drained(const ProcId& peer, const v1::RdmaHeader& header) {
  std::shared_ptr<const Registration> done;  // dropped after the lock
  detail::MutexLock lock(state_->mu);
  done = state_->stop_waiting(header.buffer(), peer);
}

namespace {

class IbverbsLink final : public link::Link {
 public:
  link::Path path(const ProcId&) const override { return link::Path::kIbverbs; }
  link::Capabilities capabilities() const override {
    link::Capabilities caps;
    caps.one_sided = true;  // the NIC reaches the owner's memory without its threads
    return caps;
  }
  void start(const std::shared_ptr<link::Transfer>& transfer) override {
    if (transfer->release) return link::start_next(transfer);  // a request: the socket's
    if (transfer->host.expired()) {
      return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    }
    transfer->transport = RdmaTransport::kIbverbs;
    IbverbsPath::instance().start(transfer);
  }
};

}  // namespace

link::Link& ibverbs_link() {
  static auto* ibverbs = new IbverbsLink;
  return *ibverbs;
}

}  // namespace castmesh::rdma
