#include "core/progress/wait_policy.h"

#include "castmesh/config.h"

#include <algorithm>
#include <thread>

namespace castmesh::progress {
namespace {

// How often a spinning thread asks whether its core is contended (one
// getrusage call each time).
constexpr int64_t kContentionCheckNs = 50'000;

// shm_spin_yield (CASTMESH_SHM_SPIN_YIELD) 1 / 0 forces the spin to yield /
// pause at every look; -1 (auto): yield only while the core is contended.
int spin_yield_forced() {
  static const int forced = [] {
    switch (config::global().shm_spin_yield) {
      case config::SpinYield::kPause: return 0;
      case config::SpinYield::kYield: return 1;
      case config::SpinYield::kAuto: break;
    }
    return -1;
  }();
  return forced;
}

}  // namespace

// One switch while pausing turns yielding on (a thread was queued behind
// this one, maybe the peer, which then costs a whole spin per step); it stays
// on while the yields keep handing the core on, at least twice per check (a
// peer sharing the core takes it at every step); a single switch then is a
// stray short thread (measured: runs that yielded at every wait for those
// took 2.7-2.9 us per 1 KiB allreduce against 1.6 us), and the spin pauses
// again.
bool SpinYield::at(int64_t now_ns) {
  if (const int forced = spin_yield_forced(); forced >= 0) return forced == 1;
  if (now_ns >= next_check_ns_) {
    const uint64_t switches = contention_.switches_since_last();
    contended_ = switches >= (contended_ ? 2u : 1u);
    next_check_ns_ = now_ns + kContentionCheckNs;
  }
  return contended_;
}

unsigned cores() {
  static const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

}  // namespace castmesh::progress
