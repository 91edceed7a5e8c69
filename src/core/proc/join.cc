#include "core/proc/join.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/trace/recorder.h"
#include "core/wire/status_code.h"

namespace castmesh::proc {
namespace {

namespace v1 = wire::v1;

// How long a worker waits for the answer to one Join before sending it again.
constexpr absl::Duration kJoinAnswerTimeout = absl::Seconds(10);

void answer_join(ProcHost& host, const ProcId& peer, uint64_t correlation, const absl::Status& verdict) {
  v1::JoinReply reply;
  wire::status_to_wire(verdict, &reply);
  if (absl::Status st = host.send_control(peer, reply, correlation); !st.ok()) {
    CASTMESH_LOG_WARN("castmesh-proc {}: cannot answer the join of {}: {}", host.id(), peer, st.ToString());
  }
}

std::string this_hostname() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

}  // namespace

std::string describe_joined(const JoinedProc& proc) {
  return absl::StrCat("rank ", proc.rank, ", pid ", proc.pid, proc.hostname.empty() ? "" : " on ", proc.hostname);
}

detail::Mutex& allocation_mutex() {
  static auto* mu = new detail::Mutex;
  return *mu;
}

// --- controller side -----------------------------------------------------

struct JoinBoard::Shared {
  detail::Mutex mu;
  detail::CondVar cv;
  int world_size ABSL_GUARDED_BY(mu) = 0;
  Check check ABSL_GUARDED_BY(mu);
  std::vector<std::optional<JoinedProc>> joined ABSL_GUARDED_BY(mu);  // by rank
  int count ABSL_GUARDED_BY(mu) = 0;
  absl::Status failure ABSL_GUARDED_BY(mu);  // the first rule broken / joined proc lost
  std::vector<ProcId> lost;  // joined procs whose connection was lost

  // The verdict on one Join. A broken rule also fails the allocation.
  absl::Status consider(const ProcId& peer, const v1::Join& join) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    JoinedProc proc{peer, static_cast<int>(join.rank()), join.pid(), join.hostname()};
    absl::Status verdict;
    if (join.world_size() != static_cast<uint32_t>(world_size)) {
      verdict = absl::InvalidArgumentError(absl::StrCat("proc ", peer, " (", describe_joined(proc),
                                                        ") was launched for a mesh of ", join.world_size(),
                                                        " procs; this allocation is for ", world_size));
    } else if (join.rank() >= static_cast<uint32_t>(world_size)) {
      verdict = absl::OutOfRangeError(absl::StrCat("proc ", peer, " (", describe_joined(proc), ") has rank ",
                                                   join.rank(), ", out of range for a mesh of ", world_size));
    } else if (const auto& already = joined[join.rank()]; already && already->id != peer) {
      verdict = absl::AlreadyExistsError(absl::StrCat("rank ", join.rank(), " joined twice: from ", already->id,
                                                      " (pid ", already->pid, already->hostname.empty() ? "" : " on ",
                                                      already->hostname, ") and from ", peer, " (pid ", join.pid(),
                                                      join.hostname().empty() ? "" : " on ", join.hostname(), ")"));
    } else if (already) {
      return absl::OkStatus();  // the same proc again (it retried): still accepted
    } else if (check) {
      verdict = check(proc);
      // "Not yet" (e.g. its pid is not recorded yet): the worker tries again.
      if (verdict.code() == absl::StatusCode::kUnavailable) return verdict;
    }
    if (!verdict.ok()) {
      if (failure.ok()) failure = verdict;
      cv.notify_all();
      return verdict;
    }
    if (trace::on()) proc.joined_ns = trace::now_ns();
    joined[proc.rank] = std::move(proc);
    ++count;
    cv.notify_all();
    return absl::OkStatus();
  }
};

JoinBoard::JoinBoard(std::shared_ptr<ProcHost> host, int world_size, Check check)
    : host_(std::move(host)), shared_(std::make_shared<Shared>()), trace_start_ns_(trace::on() ? trace::now_ns() : 0) {
  shared_->world_size = world_size;
  shared_->check = std::move(check);
  shared_->joined.resize(static_cast<size_t>(world_size));
  // Raw host pointer: the handler and observer live inside the host.
  ProcHost* raw = host_.get();
  host_->on_control(v1::Join().GetTypeName(), [shared = shared_, raw](const ProcId& peer, uint64_t correlation,
                                                                       const std::string& payload) {
    v1::Join join;
    absl::Status verdict = absl::InvalidArgumentError("malformed Join");
    if (join.ParseFromString(payload)) {
      detail::MutexLock lock(shared->mu);
      verdict = shared->consider(peer, join);
    }
    if (verdict.code() == absl::StatusCode::kUnavailable) {
      CASTMESH_LOG_DEBUG("castmesh-proc {}: join of {} not yet: {}", raw->id(), peer, verdict.ToString());
    } else if (!verdict.ok()) {
      CASTMESH_LOG_WARN("castmesh-proc {}: refused the join of {}: {}", raw->id(), peer, verdict.ToString());
    }
    answer_join(*raw, peer, correlation, verdict);
  });
  observer_id_ = host_->add_peer_lost_observer([shared = shared_](const ProcId& peer, const absl::Status& why) {
    detail::MutexLock lock(shared->mu);
    for (const auto& proc : shared->joined) {
      if (!proc || proc->id != peer) continue;
      shared->lost.push_back(peer);
      if (shared->count < shared->world_size && shared->failure.ok()) {
        shared->failure = absl::UnavailableError(
            absl::StrCat("proc ", peer, " (", describe_joined(*proc), ") joined and was lost before the mesh was complete: ",
                         why.message()));
        shared->cv.notify_all();
      }
      return;
    }
  });
}

JoinBoard::~JoinBoard() {
  host_->remove_peer_lost_observer(observer_id_);
  refuse_joins(*host_);
}

absl::Status JoinBoard::wait(absl::Time deadline, const std::function<absl::Status()>& poll) {
  while (true) {
    {
      detail::MutexLock lock(shared_->mu);
      shared_->cv.wait_for(lock, absl::Milliseconds(20), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) {
        return shared_->count == shared_->world_size || !shared_->failure.ok();
      });
      if (!shared_->failure.ok()) return shared_->failure;
      if (shared_->count == shared_->world_size) break;
    }
    if (poll) {
      if (absl::Status st = poll(); !st.ok()) return st;
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("not every proc joined");
  }
  if (trace_start_ns_ != 0 && trace::on()) trace_spawned_procs();
  return absl::OkStatus();
}

// Each proc's spawn as an async slice (they overlap) on this process's track,
// from the board's creation (the allocation's start) to its join: named
// "spawn proc", the proc as detail, its rank as value.
void JoinBoard::trace_spawned_procs() const {
  const uint32_t name = trace::intern("spawn proc");
  for (const auto& proc : joined()) {
    if (!proc || proc->joined_ns == 0) continue;
    const uint64_t id = trace::new_flow_id();
    const uint32_t detail = trace::intern(absl::StrCat(proc->id, " (", describe_joined(*proc), ")"));
    const auto rank = static_cast<uint64_t>(proc->rank);
    trace::record(trace::Record{trace_start_ns_, 0, id, rank, name, detail, trace::Category::kSpawn,
                                trace::RecordKind::kAsyncBegin});
    trace::record(trace::Record{proc->joined_ns, 0, id, rank, name, detail, trace::Category::kSpawn,
                                trace::RecordKind::kAsyncEnd});
  }
}

std::vector<int> JoinBoard::missing_ranks() const {
  detail::MutexLock lock(shared_->mu);
  std::vector<int> missing;
  for (int rank = 0; rank < shared_->world_size; ++rank) {
    if (!shared_->joined[rank]) missing.push_back(rank);
  }
  return missing;
}

std::vector<std::optional<JoinedProc>> JoinBoard::joined() const {
  detail::MutexLock lock(shared_->mu);
  return shared_->joined;
}

void JoinBoard::release_joined() {
  for (const auto& proc : joined()) {
    if (proc) (void)host_->send_control(proc->id, v1::Stop());
  }
}

std::vector<ProcId> JoinBoard::lost_procs() const {
  detail::MutexLock lock(shared_->mu);
  return shared_->lost;
}

void refuse_joins(ProcHost& host) {
  ProcHost* raw = &host;
  host.on_control(v1::Join().GetTypeName(), [raw](const ProcId& peer, uint64_t correlation, const std::string&) {
    answer_join(*raw, peer, correlation,
                absl::UnavailableError(absl::StrCat("no allocation is waiting for procs at ", raw->id(), " now")));
  });
}

// --- worker side -----------------------------------------------------------

namespace {

// One worker's joining, shared with its JoinReply handler and peer-lost
// observer (both on the I/O thread, so a reply and a loss are seen in order).
struct WorkerJoin {
  detail::Mutex mu;
  detail::CondVar cv;
  ProcId controller;  // set before the handlers are installed, read-only after
  uint64_t attempt ABSL_GUARDED_BY(mu) = 0;             // correlation of the Join in flight (0: none)
  std::optional<absl::Status> outcome ABSL_GUARDED_BY(mu);  // of that attempt: accepted (OK), refused, or connection lost
  bool accepted ABSL_GUARDED_BY(mu) = false;
  std::function<void(const absl::Status&)> on_controller_lost ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status join_controller(ProcHost& host, const ProcId& controller, int rank, int world_size,
                             absl::Time deadline, std::function<void(const absl::Status&)> on_controller_lost) {
  auto state = std::make_shared<WorkerJoin>();
  state->controller = controller;
  {
    detail::MutexLock lock(state->mu);
    state->on_controller_lost = std::move(on_controller_lost);
  }
  host.on_control(v1::JoinReply().GetTypeName(),
                  [state](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    v1::JoinReply reply;
                    if (peer != state->controller || !reply.ParseFromString(payload)) return;
                    detail::MutexLock lock(state->mu);
                    if (correlation != state->attempt || state->outcome) return;  // a late answer
                    state->outcome = wire::status_from_wire(reply);
                    state->accepted = state->outcome->ok();
                    state->cv.notify_all();
                  });
  host.add_peer_lost_observer([state](const ProcId& peer, const absl::Status& why) {
    if (peer != state->controller) return;
    std::function<void(const absl::Status&)> lost;
    {
      detail::MutexLock lock(state->mu);
      if (state->accepted) {
        lost = state->on_controller_lost;
      } else if (state->attempt != 0 && !state->outcome) {
        state->outcome = why;  // UNAVAILABLE: tried again
        state->cv.notify_all();
      }
    }
    if (lost) lost(why);
  });

  v1::Join join;
  join.set_rank(static_cast<uint32_t>(rank));
  join.set_world_size(static_cast<uint32_t>(world_size));
  join.set_pid(::getpid());
  join.set_hostname(this_hostname());
  absl::Duration pause = absl::Milliseconds(50);
  absl::Status last;
  for (uint64_t attempt = 1;; ++attempt) {
    {
      detail::MutexLock lock(state->mu);
      state->attempt = attempt;
      state->outcome.reset();
    }
    if (absl::Status sent = host.send_control(controller, join, attempt); !sent.ok()) {
      detail::MutexLock lock(state->mu);
      if (!state->outcome) state->outcome = sent;
    }
    {
      detail::MutexLock lock(state->mu);
      const absl::Time answer_by = std::min(deadline, absl::Now() + kJoinAnswerTimeout);
      state->cv.wait_for(lock, std::max(absl::ZeroDuration(), answer_by - absl::Now()),
                         [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->outcome.has_value(); });
      if (state->accepted) return absl::OkStatus();
      last = state->outcome ? *state->outcome
                            : absl::DeadlineExceededError(absl::StrCat("no answer to the join within ",
                                                                       absl::FormatDuration(kJoinAnswerTimeout)));
      state->attempt = 0;
    }
    if (last.code() != absl::StatusCode::kUnavailable && last.code() != absl::StatusCode::kDeadlineExceeded) {
      return last;  // refused for good (e.g. duplicate rank, wrong world size)
    }
    CASTMESH_LOG_DEBUG("castmesh-proc {}: join attempt {} of rank {} failed: {}", host.id(), attempt, rank,
                       last.ToString());
    if (absl::Now() + pause >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("could not join the controller at ", controller, " in time (", kEnvJoinTimeout,
                       "): ", last.message(),
                       " -- is the controller listening there, and is ", kEnvSecret, " its mesh secret?"));
    }
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(pause));
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

}  // namespace castmesh::proc
