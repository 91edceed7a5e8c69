// WaitPolicy: how a thread that waits for data-plane bytes spends its time,
// written once for every wait source (progress_engine.h): look, spin for a
// bounded time (the source's budget, never past the deadline), then sleep on
// the source's wake-up words.
//
// While it spins the thread pauses between looks (cpu_relax: cheap, keeps
// the core) unless its core is wanted by another thread, when it yields:
// - oversubscribed: more procs of this host take part than there are cores
//   (4 ranks on 2 cores), so the peer it waits for may need this very core;
// - contended: this thread is being switched off its core involuntarily
//   (platform::CoreContention), i.e. some thread really is queued behind it;
// - busy: another thread of this process holds what it looks at.
// A pausing spinner holds a core that its peer may be queued for, so every
// step of a collective would cost the whole spin (measured: 20-1000 us spins
// gave 26-1900 us per allreduce step at load 8-10 on 2 cores); yielding at
// every look costs a system call each (several us on a VM: 13.7-15.4 us per
// 1 KiB allreduce against 1.6 us pausing), so it yields only when one of the
// above holds. bench/RESULTS.md has the measurements.
//
// shm_spin_yield (CASTMESH_SHM_SPIN_YIELD, docs/config.md) forces yielding or
// pausing at every look.
// Used by one thread at a time (the waiter's own state is thread_local).
#pragma once

#include <cstdint>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/platform/core_contention.h"
#include "core/scheduler/futex.h"

namespace castmesh::progress {

// Whether the waiting thread's spin yields now, per thread.
class SpinYield {
 public:
  // Whether to yield now; re-checks the contention count when due
  // (`now_ns`: the caller's clock).
  bool at(int64_t now_ns);

 private:
  platform::CoreContention contention_;
  bool contended_ = false;
  int64_t next_check_ns_ = 0;
};

// The cores of this machine (at least 1).
unsigned cores();

// Whether `local_peers` procs of this host plus the waiting one outnumber the cores.
inline bool oversubscribed(size_t local_peers) { return local_peers + 1 > cores(); }

// Spins on `look` (a callable returning WaitSource::Look) until `done()` or
// `until`. The clock is read at every yielding look and every 16th pausing
// one (a yield costs far more than a clock read).
// `start`: the clock when the spin began.
template <typename Look, typename Done>
void spin(Look&& look, Done&& done, absl::Time start, absl::Time until, bool oversubscribed_now) {
  thread_local SpinYield t_yield;
  bool yield = oversubscribed_now || t_yield.at(absl::ToUnixNanos(start));
  for (int i = 0; !done(); ++i) {
    const auto result = look();
    if (!result.handled) {
      if (yield || result.busy) {
        std::this_thread::yield();
      } else {
        detail::cpu_relax();
      }
    }
    if (yield || (i & 15) == 15) {
      const absl::Time now = absl::Now();
      if (now >= until) break;
      yield = oversubscribed_now || t_yield.at(absl::ToUnixNanos(now));
    }
  }
}

}  // namespace castmesh::progress
