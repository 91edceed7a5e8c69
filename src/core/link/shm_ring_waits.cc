// Who reads the rings: a waiting caller (RingWaits, the progress engine's
// first wait source: spin, then sleep on the rings' waiter bells) and the
// progress thread (RingDrain: what no waiter reads, queued sends).
#include "core/link/shm_ring_internal.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "core/scheduler/futex.h"
#include "core/scheduler/scheduler.h"

namespace castmesh::link::shm_ring {

namespace {

// How long a waiting caller spins on the rings before it sleeps (1 ms: the
// default of shm_spin_us in the settings table, castmesh/config.h). Longer
// than a hand-off through the progress thread under load (two thread wake-ups,
// which took 80 us to over 1 ms on the shared 2-core VM): with a shorter spin
// two ranks settle into both sleeping at every hop (measured: 50 us and
// 200 us spins gave 60-300 us per hop in some runs against 1-2 us).
// The spin pauses (cpu_relax) rather than yielding the core unless the core
// is wanted (progress/wait_policy.h): yielding after the first 10 us avoided
// the 1 ms steps at load 5-7, but in an A/B at load 2 it was slower
// (allreduce 8 B 2.2-15 us against 2.1-3.1 us, and 64 KiB took 0.7-1 ms in 2
// of 5 runs against 25-47 us). Measured in bench/RESULTS.md.

// The spin before a waiter sleeps: shm_spin_us (separately when procs
// outnumber cores: shm_spin_oversubscribed_us). Read once per process.
absl::Duration wait_spin(bool oversubscribed) {
  static const absl::Duration normal = config::global().shm_spin;
  static const absl::Duration crowded = config::global().shm_spin_oversubscribed.value_or(normal);
  return oversubscribed ? crowded : normal;
}

// shm_waiter_sleep=0 (CASTMESH_SHM_WAITER_SLEEP): a waiter sleeps on its request after the
// spin and the progress thread serves it (the path before the waiter bells; for
// A/B measurements, and the behaviour where futex_waitv is missing).
bool waiter_sleep_enabled() {
  static const bool on = config::global().shm_waiter_sleep;
  return on;
}

// A waiting caller's wait on the rings (progress::WaitSource): it spins on
// its inbound rings under the engine's wait policy, counted as their poller
// for the whole wait, asleep or not (producers then never ring the progress
// thread for these rings, which leaves their records to this thread:
// core/shm_link/shm_ring.h), then sleeps on every ring's waiter bell and its
// request's word at once (sleep()).
class RingWaits : public progress::WaitSource {
 public:
  bool begin_wait(size_t& local_peers) override {
    if (t_state.inside) return false;
    std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> peers = Links::instance().readers();
    if (peers->empty()) return false;
    local_peers = peers->size();
    t_state.inside = true;
    t_state.peers = std::move(peers);
    return true;
  }
  absl::Duration spin_budget(bool oversubscribed) override { return wait_spin(oversubscribed); }
  void start_spin() override {
    // The awaited record was not there at the first look: count as a poller
    // now (two writes to lines the peers' producers read, so not before).
    for (const auto& p : *t_state.peers) p->inbound->start_polling();
    t_state.polling = true;
  }
  Look look() override {
    Look result;
    for (const auto& p : *t_state.peers) {
      const Links::Consumed c = Links::instance().consume(*p);
      result.handled |= c == Links::Consumed::kHandled;
      result.busy |= c == Links::Consumed::kBusy;
    }
    return result;
  }
  bool sleep(detail::RequestState& request, absl::Time deadline) override {
    if (t_state.peers->size() >= detail::kFutexWaitAnyMax || !waiter_sleep_enabled()) return false;
    return Links::instance().sleep(request, *t_state.peers, deadline);
  }
  void end_wait() override {
    if (t_state.polling) {
      for (const auto& p : *t_state.peers) p->inbound->stop_polling();
      Links::instance().poll();  // a record published while we spun may not have rung anybody
    }
    t_state = State{};
  }

 private:
  struct State {
    bool inside = false;
    bool polling = false;
    std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> peers;
  };
  static thread_local State t_state;
};
thread_local RingWaits::State RingWaits::t_state;

}  // namespace

bool Links::sleep(detail::RequestState& request, const std::vector<std::shared_ptr<Peer>>& peers,
                  absl::Time deadline) {
  // One wake-up per message: this thread sleeps on every ring's waiter bell
  // and on the request's own word (complete() from any other path: the
  // socket, this process, a lost peer) at once, and reads the rings itself
  // when woken; the progress thread stays asleep.
  std::vector<detail::FutexWaitItem> items(peers.size() + 1);
  detail::Scheduler::BlockingScope blocking;  // a pooled actor hands its queued work on
  auto look = [&] {
    bool any = false;
    for (const auto& p : peers) any |= consume(*p) == Consumed::kHandled;
    return any;
  };
  while (!request.done()) {
    if (absl::Now() >= deadline) return true;
    request.add_sleeper();
    for (size_t i = 0; i < peers.size(); ++i) {
      items[i] = {peers[i]->inbound->waiter_bell(), peers[i]->inbound->arm_waiter(), /*shared=*/true};
    }
    items[peers.size()] = {request.done_word(), 0, /*shared=*/false};
    // Armed: a record published from here on wakes us; one published before
    // is read now.
    bool ready = false;
    for (const auto& p : peers) ready |= p->inbound->readable();
    detail::FutexWaitAny slept = detail::FutexWaitAny::kWoken;
    if (!ready && !request.done()) {
      // Bounded, so a ring that came up meanwhile (not in `peers`) is waited
      // on at the next wait at the latest.
      slept = detail::futex_wait_any(items.data(), static_cast<int>(items.size()),
                                     std::min(deadline, absl::Now() + absl::Milliseconds(50)));
      if (slept != detail::FutexWaitAny::kUnsupported) g_waiter_sleeps.fetch_add(1, std::memory_order_relaxed);
    }
    for (const auto& p : peers) p->inbound->disarm_waiter();
    request.remove_sleeper();
    if (slept == detail::FutexWaitAny::kUnsupported) return false;
    // Read what came (another thread may hold a ring: it hands its records
    // on itself).
    while (!request.done() && look()) {
    }
  }
  return true;
}

namespace {

// What no waiting caller reads, on the engine's progress thread: records
// that arrive while no thread of this process waits (unexpected messages,
// ranks busy elsewhere) and the sends that progress contexts queued when a
// ring was full. Its thread sleeps on every served ring's doorbell at once.
class RingDrain : public progress::BackgroundSource {
 public:
  bool run_once() override {
    ShmProgressScope progress;
    t_drain_thread = true;
    busy_ring_ = false;
    bool did = false;
    const auto peers = Links::instance().drains();
    for (const auto& p : *peers) {
      if (p->lost.load(std::memory_order_acquire)) continue;
      // Queued sends first, even while a waiter holds the ring: it may sleep
      // there for long, and the peer may be waiting for them.
      if (p->has_backlog.load(std::memory_order_acquire) && !p->producing.test_and_set(std::memory_order_acquire)) {
        did |= Links::flush_backlog(*p);
        p->producing.clear(std::memory_order_release);
      }
      // A waiting thread spins on the ring: leave the records to it (it looks
      // once more when it stops). Taking them would make it wait for this
      // thread, which may not have a core.
      if (!p->inbound_started.load(std::memory_order_acquire) || p->inbound->polled()) continue;
      const Links::Consumed c = Links::instance().consume(*p);
      did |= c == Links::Consumed::kHandled;
      busy_ring_ |= c == Links::Consumed::kBusy;
    }
    t_drain_thread = false;
    return did;
  }

  bool arm(std::vector<detail::FutexWaitItem>& items, absl::Duration& nap) override {
    armed_ = Links::instance().drains();
    bool ready = false;
    // A waiting thread just stopped spinning and reads the ring: look again soon.
    if (busy_ring_) nap = std::min(nap, absl::Microseconds(20));
    for (const auto& p : *armed_) {
      if (p->lost.load(std::memory_order_acquire)) continue;
      if (p->has_backlog.load(std::memory_order_acquire)) nap = std::min(nap, absl::Microseconds(200));
      if (!p->inbound_started.load(std::memory_order_acquire)) continue;
      if (items.size() >= static_cast<size_t>(detail::kFutexWaitAnyMax)) {
        nap = std::min(nap, absl::Milliseconds(1));  // more rings than one sleep can watch
        continue;
      }
      if (p->inbound->polled()) {
        // Unannounced: producers do not ring for it, so records that land
        // between two waits of a thread that waits again and again cost no
        // wake-up (its next wait reads them; measured, 1 KiB allreduce loop at
        // -n 2: 1,200-4,700 rings per 6,467 records, and this thread handed on
        // 9-48% of them, when the nap was announced); what it leaves unread is
        // taken here when the nap ends.
        items.push_back(detail::FutexWaitItem{p->inbound->doorbell(), p->inbound->doorbell()->load(), true});
        nap = std::min(nap, absl::Milliseconds(5));
        continue;
      }
      items.push_back(detail::FutexWaitItem{p->inbound->doorbell(), p->inbound->arm_sleeper(), true});
      p->drain_armed = true;
      ready |= p->inbound->readable();
    }
    return ready;
  }

  void disarm() override {
    if (armed_ == nullptr) return;
    for (const auto& p : *armed_) {
      if (p->drain_armed) p->inbound->disarm_sleeper();
      p->drain_armed = false;
    }
    armed_.reset();
  }

 private:
  bool busy_ring_ = false;  // a ring another thread held in the last round
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> armed_;
};

}  // namespace

void Links::start_drain(const std::shared_ptr<Peer>& p) {
  static RingWaits* waits = [] {
    auto* made = new RingWaits;  // leaked with the engine that calls it
    progress::ProgressEngine::instance().add_wait_source(made, /*rank=*/0);
    return made;
  }();
  static RingDrain* drain = [] {
    auto* made = new RingDrain;
    progress::ProgressEngine::instance().add_background_source(made);
    return made;
  }();
  (void)waits;
  (void)drain;
  if (!p->drain_started.exchange(true)) {
    detail::MutexLock lock(mu_);
    drains_ = with_peer(*drains_, p);
  }
  progress::ProgressEngine::instance().wake_background();
}

std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> Links::hold_polled() {
  auto peers = readers();
  for (const auto& p : *peers) p->inbound->start_polling();
  return peers;
}

void Links::release_polled(const std::vector<std::shared_ptr<Peer>>& peers) {
  for (const auto& p : peers) p->inbound->stop_polling();
  poll();  // a record published while the rings were held rang nobody
}

}  // namespace castmesh::link::shm_ring
