#include "core/debug/native_stacks.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

#if defined(__linux__)
#include <dirent.h>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#endif

namespace castmesh::debug {

#if defined(__linux__)
namespace {

constexpr int kMaxThreads = 4096;
constexpr int kMaxFrames = 128;

enum SlotState : int { kIdle, kArmed, kWriting, kDone, kAbandoned };

// Written by one thread's signal handler, read by the capturing thread once
// `state` is kDone (acquire). A slot is re-armed only by a later capture,
// and only if no handler can still be writing it (see abandon()).
struct Slot {
  std::atomic<int> state{kIdle};
  std::atomic<pid_t> tid{0};
  uintptr_t pthread_id = 0;
  uintptr_t pc = 0;
  int depth = 0;
  void* frames[kMaxFrames] = {};
  detail::RunningNow running;
};

// The slots the handler looks in. Replaced (the old array leaked on
// purpose) only when a handler was still writing one after the grace
// period, so a late handler never writes memory a later capture reads.
std::atomic<Slot*> g_slots{nullptr};
std::atomic<int> g_slot_count{0};
sem_t g_answers;
// 1 while a capture holds the answered threads (capture_native_stacks'
// while_stopped); a futex word the handlers wait on.
std::atomic<uint32_t> g_hold{0};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);
// How long a handler waits for the release at most, in 100 ms steps: a
// capture that never releases (it cannot happen, but a stuck process is
// what this tool is for) must not stop the process's threads for good.
constexpr int kMaxHoldSteps = 50;

pid_t current_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

uintptr_t interrupted_pc(void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// The signal handler: async-signal-safe only (atomics, gettid, backtrace
// after it was primed, sem_post).
void on_stack_signal(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  Slot* slots = g_slots.load(std::memory_order_acquire);
  const int count = g_slot_count.load(std::memory_order_acquire);
  const pid_t tid = current_tid();
  for (int i = 0; slots != nullptr && i < count; ++i) {
    Slot& slot = slots[i];
    if (slot.tid.load(std::memory_order_relaxed) != tid) continue;
    int expected = kArmed;
    if (slot.state.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel)) {
      slot.pthread_id = static_cast<uintptr_t>(pthread_self());
      slot.pc = interrupted_pc(context);
      slot.depth = backtrace(slot.frames, kMaxFrames);
      detail::read_running_now(&slot.running);
      slot.state.store(kDone, std::memory_order_release);
      sem_post(&g_answers);
      for (int step = 0; step < kMaxHoldSteps && g_hold.load(std::memory_order_acquire) != 0; ++step) {
        timespec wait{0, 100 * 1000 * 1000};
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_hold), FUTEX_WAIT_PRIVATE, 1u, &wait, nullptr, 0);
      }
    }
    break;
  }
  errno = saved_errno;
}

absl::Status install_handler() {
  static absl::Status installed = [] {
    // backtrace() loads libgcc_s on its first call (malloc, locks): do that
    // here, never in the handler.
    void* prime[4];
    (void)backtrace(prime, 4);
    if (sem_init(&g_answers, 0, 0) != 0) return absl::InternalError("sem_init failed");
    g_slots.store(new Slot[kMaxThreads], std::memory_order_release);
    struct sigaction old {};
    if (sigaction(native_stack_signal(), nullptr, &old) != 0) return absl::InternalError("sigaction failed");
    const bool taken = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                                    : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (taken) {
      return absl::FailedPreconditionError(absl::StrCat("signal ", native_stack_signal(),
                                                        " (SIGRTMIN+5), used for native stack dumps, already has "
                                                        "a handler in this process"));
    }
    struct sigaction sa {};
    sa.sa_sigaction = on_stack_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(native_stack_signal(), &sa, nullptr) != 0) return absl::InternalError("sigaction failed");
    return absl::OkStatus();
  }();
  return installed;
}

std::vector<pid_t> list_threads() {
  std::vector<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* entry = readdir(dir)) {
    int tid = 0;
    if (absl::SimpleAtoi(entry->d_name, &tid)) tids.push_back(tid);
  }
  closedir(dir);
  return tids;
}

std::string thread_name(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/self/task/", tid, "/comm"));
  std::string name;
  std::getline(in, name);
  return name;
}

// Serialises captures: one set of slots, one semaphore.
detail::Mutex& capture_mutex() {
  static auto* mu = new detail::Mutex();
  return *mu;
}

}  // namespace

int native_stack_signal() { return SIGRTMIN + 5; }

absl::StatusOr<std::vector<RawThreadStack>> capture_native_stacks(absl::Duration timeout,
                                                                  const std::function<void()>& while_stopped) {
  if (absl::Status st = install_handler(); !st.ok()) return st;
  detail::MutexLock lock(capture_mutex());
  const pid_t self = current_tid();
  std::vector<pid_t> tids;
  for (pid_t tid : list_threads()) {
    if (tid != self && static_cast<int>(tids.size()) < kMaxThreads) tids.push_back(tid);
  }
  Slot* slots = g_slots.load(std::memory_order_acquire);
  const int n = static_cast<int>(tids.size());
  while (sem_trywait(&g_answers) == 0) {
  }  // answers a previous capture gave up on
  for (int i = 0; i < n; ++i) {
    slots[i].state.store(kIdle, std::memory_order_relaxed);
    slots[i].tid.store(tids[i], std::memory_order_relaxed);
    slots[i].state.store(kArmed, std::memory_order_release);
  }
  g_hold.store(while_stopped ? 1 : 0, std::memory_order_release);
  g_slot_count.store(n, std::memory_order_release);
  const pid_t pid = getpid();
  int expected = 0;
  std::vector<bool> gone(n, false);
  for (int i = 0; i < n; ++i) {
    if (syscall(SYS_tgkill, pid, tids[i], native_stack_signal()) == 0) {
      ++expected;
    } else {
      gone[i] = true;  // exited since it was listed
    }
  }
  // Wait for the answers (each posts once) until the deadline.
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline = absl::ToTimespec(absl::DurationFromTimespec(deadline) + timeout);
  for (int got = 0; got < expected;) {
    if (sem_clockwait(&g_answers, CLOCK_MONOTONIC, &deadline) == 0) {
      ++got;
    } else if (errno != EINTR) {
      break;  // ETIMEDOUT
    }
  }
  if (while_stopped) while_stopped();
  g_hold.store(0, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_hold), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  // Give up on the silent ones; wait (bounded) for handlers already writing.
  bool still_writing = false;
  for (int i = 0; i < n; ++i) {
    int state = kArmed;
    if (slots[i].state.compare_exchange_strong(state, kAbandoned, std::memory_order_acq_rel)) continue;
    for (int spins = 0; state == kWriting && spins < 100000; ++spins) {
      sched_yield();
      state = slots[i].state.load(std::memory_order_acquire);
    }
    if (state == kWriting) still_writing = true;
  }
  g_slot_count.store(0, std::memory_order_release);
  std::vector<RawThreadStack> out(n);
  for (int i = 0; i < n; ++i) {
    RawThreadStack& t = out[i];
    t.tid = tids[i];
    t.name = thread_name(tids[i]);
    if (gone[i] || slots[i].state.load(std::memory_order_acquire) != kDone) continue;
    t.answered = true;
    t.pthread_id = slots[i].pthread_id;
    t.running = slots[i].running;
    // backtrace() from the handler starts with the handler's own frames and
    // the kernel's signal trampoline; the interrupted pc, where known, marks
    // the first frame of the thread itself.
    int first = 0;
    const int depth = slots[i].depth;
    if (slots[i].pc != 0) {
      first = depth;
      for (int f = 0; f < depth; ++f) {
        if (reinterpret_cast<uintptr_t>(slots[i].frames[f]) == slots[i].pc) {
          first = f;
          break;
        }
      }
      if (first == depth) {
        // The pc is not among the frames: the handler ran later than the
        // signal came (ThreadSanitizer defers handlers to its next
        // interceptor) or the unwinder stopped at the trampoline. The pc,
        // then what the unwinder found past the handler's own frame.
        t.pcs.push_back(slots[i].pc);
        first = 1;
      }
    } else {
      first = depth > 2 ? 2 : depth;
    }
    for (int f = first; f < depth; ++f) t.pcs.push_back(reinterpret_cast<uintptr_t>(slots[i].frames[f]));
  }
  if (still_writing) g_slots.store(new Slot[kMaxThreads], std::memory_order_release);  // see g_slots
  return out;
}

#else  // !__linux__

int native_stack_signal() { return 0; }

absl::StatusOr<std::vector<RawThreadStack>> capture_native_stacks(absl::Duration, const std::function<void()>&) {
  return absl::UnimplementedError("native stack dumps need Linux (/proc/self/task, tgkill)");
}

#endif

}  // namespace castmesh::debug
