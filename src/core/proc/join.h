// The Join step of the proc protocol, both sides (docs/procs.md): a worker
// proc tells its controller "rank R of a mesh of N procs is up here" (Join)
// and the controller answers (JoinReply). Used by every allocator: the
// LocalAllocator's children and procs started by a launcher join the same
// way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "core/proc/proc_host.h"

namespace castmesh::proc {

// A proc that joined an allocation. Plain value.
struct JoinedProc {
  ProcId id;             // its address (the proc id it proved in the handshake)
  int rank = 0;
  int64_t pid = 0;       // in its own host
  std::string hostname;  // its host's name ("" if it did not say)
  int64_t joined_ns = 0;  // when it joined (trace clock), while a trace records; else 0
};

// "rank 2, pid 1234 on node7": how errors name a proc.
std::string describe_joined(const JoinedProc& proc);

// One allocation per process at a time: a host has one Join handler.
detail::Mutex& allocation_mutex();

// Controller side: collects the joins of one allocation of `world_size`
// procs on `host`, installed as the host's Join handler for its lifetime.
// Each Join is answered at once: accepted, or rejected with the reason. A
// join that breaks the rules (rank out of range, another world size, a rank
// that already joined from another proc, or `check`'s error) is rejected
// AND fails the allocation: it means the launch is misconfigured. A proc
// that joined and is lost before every rank has joined also fails it.
// Procs that cannot prove the mesh secret never get here (the transport
// refuses them). Thread-safe: the handler and the peer-lost observer run on
// the host's I/O thread; wait() and the rest on the allocating thread.
class JoinBoard {
 public:
  // Extra rule for a join (e.g. the local allocator's pid check). An
  // UNAVAILABLE answer means "not yet": the worker is told to try again and
  // the allocation goes on.
  using Check = std::function<absl::Status(const JoinedProc&)>;

  JoinBoard(std::shared_ptr<ProcHost> host, int world_size, Check check = {});
  // Uninstalls the board: later joins are answered UNAVAILABLE ("no
  // allocation is waiting"), which a worker retries until its own timeout.
  ~JoinBoard();
  JoinBoard(const JoinBoard&) = delete;
  JoinBoard& operator=(const JoinBoard&) = delete;

  // Waits until every rank joined (OK), the allocation failed (the reason),
  // `poll` returned an error (called every ~20 ms; e.g. a child that
  // exited), or `deadline` (DeadlineExceeded, without details: the caller
  // names missing_ranks()).
  absl::Status wait(absl::Time deadline, const std::function<absl::Status()>& poll = {});
  // Ranks that have not joined, in order.
  std::vector<int> missing_ranks() const;
  // The joined procs by rank (every entry set once wait() returned OK).
  std::vector<std::optional<JoinedProc>> joined() const;
  // Sends Stop to every proc that joined: a failed allocation lets them go.
  void release_joined();
  // Joined procs whose connection was lost (also after the mesh was
  // complete, until this board is destroyed): the mesh made from this board
  // starts with them gone.
  std::vector<ProcId> lost_procs() const;

 private:
  struct Shared;
  // Records each joined proc's spawn while a trace records (wait(), when complete).
  void trace_spawned_procs() const;

  std::shared_ptr<ProcHost> host_;
  std::shared_ptr<Shared> shared_;  // also held by the handler and observer
  uint64_t observer_id_ = 0;
  int64_t trace_start_ns_ = 0;  // the board's creation while a trace records, else 0
};

// Installs the Join handler that answers "no allocation is waiting"
// (UNAVAILABLE, retried by workers), e.g. while a rendezvous controller
// listens before allocate() runs. JoinBoard's destructor installs it too.
void refuse_joins(ProcHost& host);

// Worker side: joins the controller at `controller` as `rank` of a mesh of
// `world_size` procs. Tries again after a connection failure or an
// UNAVAILABLE answer (the controller may not listen or allocate yet), with a
// growing pause, until `deadline`. Returns OK once accepted; the
// controller's reason when it refused (e.g. duplicate rank); or
// DeadlineExceeded with the last failure. After acceptance,
// `on_controller_lost` runs (on the I/O thread) when the connection to the
// controller is lost. Blocks; not on the host's I/O thread.
absl::Status join_controller(ProcHost& host, const ProcId& controller, int rank, int world_size,
                             absl::Time deadline, std::function<void(const absl::Status&)> on_controller_lost);

}  // namespace castmesh::proc
