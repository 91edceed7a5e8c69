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
#include "core/collectives/request_state.h"
#include "core/platform/process.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
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

bool wait_on_sockets(detail::RequestState& request, detail::WaitDeadline& deadline, detail::WaitMode mode);

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
    static const bool installed = [] {
      detail::set_socket_waiter(&wait_on_sockets);
      return true;
    }();
    (void)installed;
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
bool sleep(detail::RequestState& request, const WatchList& list, absl::Time deadline) {
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

bool wait_on_sockets(detail::RequestState& request, detail::WaitDeadline& deadline, detail::WaitMode mode) {
  if (t_reading) return false;
  const std::shared_ptr<const WatchList> list = Watches::instance().snapshot();
  if (list->empty()) return false;
  if (mode == detail::WaitMode::kLook) {
    read_all(*list, nullptr);
    return false;
  }
  // The awaited frame is often there already: one look before the clock.
  if (read_all(*list, nullptr), request.done()) return true;
  // More procs of this host than cores: looks give the core away.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t local = std::count_if(list->begin(), list->end(), [](const auto& w) { return w->on_this_host; });
  const bool oversubscribed = local + 1 > cores;
  const bool spin = spin_pays();
  if (spin && io_thread_defers()) defer_io_threads(*list);
  const absl::Time start = absl::Now();
  const absl::Time until = std::min(start + (spin ? spin_time() : absl::ZeroDuration()), deadline.at(start));
  bool first = true;
  for (int i = 0; !request.done(); ++i) {
    if (!read_all(*list, nullptr)) {
      if (oversubscribed) {
        std::this_thread::yield();
      } else {
        detail::cpu_relax();
      }
    }
    if ((first || (i & 15) == 15) && absl::Now() >= until) break;
    first = false;
  }
  note_spin(request.done());
  if (request.done() || absl::Now() >= deadline.at()) return true;
  return sleep(request, *list, deadline.at());
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
