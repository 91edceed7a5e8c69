#include "core/collectives/socket_wait.h"

#include <poll.h>
#include <unistd.h>

#include "core/platform/platform.h"
#if CASTMESH_LINUX_FACILITIES
#include <sys/eventfd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/exchange.h"
#include "core/platform/process.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/progress/progress_engine.h"
#include "core/progress/request_state.h"
#include "core/scheduler/futex.h"
#include "core/scheduler/scheduler.h"
#include "core/transport/endpoint.h"

namespace castmesh::collectives {
namespace {

namespace v1 = wire::v1;

std::atomic<uint64_t> g_waiter_reads{0};
std::atomic<uint64_t> g_waiter_sleeps{0};

// Set while this thread reads a watched socket: frames it delivers need no
// watching (they came through a reader), and a wait nested in a delivery
// (none should block, but a request's test() may look) reads nothing.
thread_local bool t_reading = false;

bool enabled() {
  static const bool on = config::global().socket_wait;
  return on;
}

bool io_thread_defers() {
  static const bool on = config::global().socket_io_defer;
  return on;
}

absl::Duration spin_time() {
  static const absl::Duration spin = config::global().socket_spin;
  return spin;
}

// Whether spinning pays: a spin that ends without the message costs its
// whole length and, on a host whose cores are all busy, delays the very
// threads (the peer's, the I/O threads) that would send it. After
// kSpinMisses spins in a row that did not end the wait, waiters sleep at
// once, trying one spin again every kSpinRetry waits.
constexpr int kSpinMisses = 4;
constexpr uint32_t kSpinRetry = 64;
std::atomic<int> g_spin_misses{0};
std::atomic<uint32_t> g_waits_without_spin{0};

bool spin_pays() {
  if (g_spin_misses.load(std::memory_order_relaxed) < kSpinMisses) return true;
  return g_waits_without_spin.fetch_add(1, std::memory_order_relaxed) % kSpinRetry == kSpinRetry - 1;
}

void note_spin(bool ended_the_wait) {
  if (ended_the_wait) {
    g_spin_misses.store(0, std::memory_order_relaxed);
  } else if (g_spin_misses.load(std::memory_order_relaxed) < kSpinMisses) {
    g_spin_misses.fetch_add(1, std::memory_order_relaxed);
  }
}

// Communicator data frames, which the waiting thread may deliver itself;
// the link handshake (shared-memory rings, kCollectiveLinkDataType) stays on
// the I/O thread.
bool waiter_may_deliver(std::string_view data_type) { return data_type == kCollectiveDataType; }

class SocketWaits;
SocketWaits& socket_waits();

// One watched connection.
struct Watched {
  std::weak_ptr<proc::ProcHost> host;  // alive while a reader is used: its endpoint owns the connection
  ProcId peer;
  bool on_this_host = false;
  std::shared_ptr<transport::PeerReader> reader;
};
using WatchList = std::vector<std::shared_ptr<Watched>>;

// The watched connections: a list replaced, never changed, so waiters read
// a snapshot without a lock.
class Watches {
 public:
  static Watches& instance() {
    static auto* watches = new Watches;  // leaked: used from exit paths
    return *watches;
  }

  std::shared_ptr<const WatchList> snapshot() {
    detail::MutexLock lock(mu_);
    return list_;
  }

  void add(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer) {
    {
      detail::MutexLock lock(mu_);
      for (const auto& w : *list_) {
        if (w->peer == peer && !w->host.owner_before(host) && !host.owner_before(w->host)) return;
      }
    }
    std::shared_ptr<transport::PeerReader> reader = transport::Endpoint::delivering_reader(&waiter_may_deliver);
    if (reader == nullptr) return;
    auto w = std::make_shared<Watched>(Watched{host, peer, platform::proc_on_this_host(peer), std::move(reader)});
    (void)socket_waits();  // registers the wait source
    detail::MutexLock lock(mu_);
    auto next = std::make_shared<WatchList>(*list_);
    next->push_back(std::move(w));
    list_ = std::move(next);
  }

  void remove(const Watched* gone) {
    detail::MutexLock lock(mu_);
    auto next = std::make_shared<WatchList>();
    for (const auto& w : *list_) {
      if (w.get() != gone) next->push_back(w);
    }
    list_ = std::move(next);
  }

 private:
  detail::Mutex mu_;
  std::shared_ptr<const WatchList> list_ ABSL_GUARDED_BY(mu_) = std::make_shared<WatchList>();
};

// Reads every watched socket once, and writes what each connection has
// queued beyond what its sender wrote at once (the rest of a large
// message), which would otherwise wait for the I/O thread, and that does
// not preempt a spinning waiter. True when it delivered or wrote something.
// `busy[i]`: reader i could not be read now (another thread holds it, or
// its next frame is the I/O thread's).
bool read_all(const WatchList& list, std::vector<char>* busy) {
  bool any = false;
  t_reading = true;
  for (size_t i = 0; i < list.size(); ++i) {
    Watched& w = *list[i];
    std::shared_ptr<proc::ProcHost> host = w.host.lock();  // keeps the endpoint, and so the connection, alive
    transport::PeerReader::Pumped pumped =
        host == nullptr ? transport::PeerReader::Pumped::kGone : w.reader->pump();
    if (pumped == transport::PeerReader::Pumped::kDelivered) {
      any = true;
      g_waiter_reads.fetch_add(1, std::memory_order_relaxed);
    }
    if (pumped == transport::PeerReader::Pumped::kGone) {
      Watches::instance().remove(&w);
    } else if (w.reader->push()) {
      any = true;
    }
    if (busy != nullptr) (*busy)[i] = pumped == transport::PeerReader::Pumped::kBusy;
  }
  t_reading = false;
  return any;
}

// Asks the I/O thread of every watched connection's endpoint not to
// preempt this thread's spin when a frame wakes it (PeerReader::defer_io_thread).
void defer_io_threads(const WatchList& list) {
  for (const auto& w : list) {
    std::shared_ptr<proc::ProcHost> host = w->host.lock();  // keeps the endpoint alive
    if (host != nullptr) w->reader->defer_io_thread();
  }
}

// This thread's eventfd, which a request's completion writes while the
// thread sleeps on it. A plain int, not an object with a destructor: a
// wait can run after this thread's thread_local objects are destroyed (a
// static's destructor at exit waiting on a request), and a closed number
// handed to a request would let complete() write into whatever descriptor
// reuses it (a socket: SIGPIPE, or 8 bytes inside a stream). -2: not made
// yet; -1: none (no eventfd on this system, or this thread is exiting).
thread_local int t_wake_fd = -2;

struct WakeFdCloser {
  ~WakeFdCloser() {
    if (t_wake_fd >= 0) ::close(t_wake_fd);
    t_wake_fd = -1;
  }
};

int wake_fd() {
  if (t_wake_fd != -2) return t_wake_fd;
#if CASTMESH_LINUX_FACILITIES
  t_wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t_wake_fd >= 0) {
    static thread_local WakeFdCloser closer;
    (void)closer;
  } else {
    t_wake_fd = -1;
  }
#else
  t_wake_fd = -1;  // elsewhere a waiter sleeps on its request instead
#endif
  return t_wake_fd;
}

void drain_wake_fd(int fd) {
  uint64_t n;
  while (::read(fd, &n, sizeof(n)) > 0) {
  }
}

// Sleeps in poll() on the watched sockets and the request's eventfd,
// reading the sockets each time it wakes, until the request is done or
// `deadline`. False when this thread cannot (no eventfd).
bool sleep_on_sockets(detail::RequestState& request, const WatchList& list, absl::Time deadline) {
  const int wake = wake_fd();
  if (wake < 0) return false;
  detail::Scheduler::BlockingScope blocking;  // a pooled actor hands its queued work on
  std::vector<char> busy(list.size(), 0);
  std::vector<pollfd> fds;
  fds.reserve(list.size() + 1);
  request.set_wake_fd(wake);
  while (!request.done()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    fds.clear();
    fds.push_back(pollfd{wake, POLLIN, 0});
    bool skipped = false;
    for (size_t i = 0; i < list.size(); ++i) {
      // A socket whose next frame waits for the I/O thread stays readable
      // until that thread has read it: not polled this round.
      if (busy[i]) {
        skipped = true;
        continue;
      }
      fds.push_back(pollfd{list[i]->reader->fd(), POLLIN, 0});
    }
    // Bounded, so connections watched meanwhile (and skipped ones) are
    // read again soon.
    const absl::Duration cap = skipped ? absl::Milliseconds(1) : absl::Milliseconds(50);
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(std::min(deadline - now, cap), absl::Milliseconds(1)));
    g_waiter_sleeps.fetch_add(1, std::memory_order_relaxed);
    (void)::poll(fds.data(), fds.size(), static_cast<int>(ms));
    if (fds[0].revents != 0) drain_wake_fd(wake);
    while (!request.done() && read_all(list, &busy)) {
    }
  }
  request.set_wake_fd(-1);
  drain_wake_fd(wake);
  return true;
}

// A waiting caller's wait on the watched sockets (progress::WaitSource):
// it reads them under the engine's wait policy for up to the spin budget,
// then sleeps in poll() on them and on its request's eventfd (sleep()).
class SocketWaits : public progress::WaitSource {
 public:
  bool begin_wait(size_t& local_peers) override {
    if (t_reading || t_list != nullptr) return false;
    std::shared_ptr<const WatchList> list = Watches::instance().snapshot();
    if (list->empty()) return false;
    local_peers = static_cast<size_t>(
        std::count_if(list->begin(), list->end(), [](const auto& w) { return w->on_this_host; }));
    t_list = std::move(list);
    return true;
  }
  absl::Duration spin_budget(bool) override {
    t_spun = spin_pays();
    return t_spun ? spin_time() : absl::ZeroDuration();
  }
  void start_spin() override {
    if (t_spun && io_thread_defers()) defer_io_threads(*t_list);
  }
  void end_spin(bool ended_wait) override {
    if (t_spun) note_spin(ended_wait);
  }
  Look look() override {
    Look result;
    result.handled = read_all(*t_list, nullptr);
    return result;
  }
  bool sleep(detail::RequestState& request, absl::Time deadline) override {
    return sleep_on_sockets(request, *t_list, deadline);
  }
  void end_wait() override {
    t_list.reset();
    t_spun = false;
  }

 private:
  // This thread's wait (begin_wait to end_wait).
  static thread_local std::shared_ptr<const WatchList> t_list;
  static thread_local bool t_spun;
};
thread_local std::shared_ptr<const WatchList> SocketWaits::t_list;
thread_local bool SocketWaits::t_spun = false;

SocketWaits& socket_waits() {
  static SocketWaits* waits = [] {
    auto* made = new SocketWaits;  // leaked with the engine that calls it
    progress::ProgressEngine::instance().add_wait_source(made, /*rank=*/1);
    return made;
  }();
  return *waits;
}

}  // namespace

void watch_socket_peer(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer) {
  if (t_reading || !enabled()) return;
  Watches::instance().add(host, peer);
}

SocketWaitStats socket_wait_stats() {
  SocketWaitStats stats;
  stats.waiter_reads = g_waiter_reads.load(std::memory_order_relaxed);
  stats.waiter_sleeps = g_waiter_sleeps.load(std::memory_order_relaxed);
  stats.watched = static_cast<int>(Watches::instance().snapshot()->size());
  return stats;
}

}  // namespace castmesh::collectives
