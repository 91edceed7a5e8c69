#include "core/progress/wait_policy.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <thread>

namespace castmesh::progress {
namespace {

// How often a spinning thread asks whether its core is contended (one
// getrusage call each time).
constexpr int64_t kContentionCheckNs = 50'000;

// CASTMESH_SHM_SPIN_YIELD=1 / 0 forces the spin to yield / pause at every
// look; -1 (unset): yield only while the core is contended.
int spin_yield_forced() {
  static const int forced = [] {
    const char* v = std::getenv("CASTMESH_SHM_SPIN_YIELD");
    if (v == nullptr || *v == '\0') return -1;
    return std::string_view(v) == "0" ? 0 : 1;
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
