// The pieces of a stack dump inside one process: the symbolizer, the
// per-thread signal capture (a thread parked in C answers with its frames;
// one that blocks the signal is reported as silent within the bound), and
// the parser of faulthandler's text.
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/debug/native_stacks.h"
#include "core/debug/python_stacks.h"
#include "core/debug/symbolizer.h"

namespace castmesh::debug {
namespace {

bool addr2line_on_path() { return std::system("addr2line --version >/dev/null 2>&1") == 0; }

// A frame of this test's own, with a name the symbolizer must find.
[[gnu::noinline]] void park_in_pause(const std::atomic<bool>& done) {
  while (!done.load()) pause();  // each dump's signal wakes it; the loop parks it again
  asm volatile("");             // keeps the call a call (not a tail jump)
}

// ThreadSanitizer runs a thread's asynchronous signal handlers only when that
// thread next reaches one of its interceptors, not when the signal arrives:
// a thread in a busy loop or parked in a system call answers late or never,
// so the capture's timing guarantees cannot hold there (the dump itself still
// works: AParkedThreadAnswers... runs under TSan too).
[[maybe_unused]] constexpr const char* kTsanDefersSignals =
    "ThreadSanitizer defers asynchronous signals to its own safe points, so a thread is not captured or held "
    "when the dump's signal arrives";

TEST(Symbolizer, NamesAnExportedFunctionAndItsObject) {
  const auto pc = reinterpret_cast<uintptr_t>(&getpid);
  std::vector<Symbol> s = symbolize({pc}, {false}, /*file_lines=*/false, absl::Seconds(30));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NE(s[0].function.find("getpid"), std::string::npos) << s[0].function;
  EXPECT_NE(s[0].object.find("libc"), std::string::npos) << s[0].object;
}

TEST(Symbolizer, DemanglesAndFindsTheSourceLineWithAddr2line) {
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("main"), "main");
  const auto pc = reinterpret_cast<uintptr_t>(&park_in_pause);
  std::vector<Symbol> s = symbolize({pc}, {false}, /*file_lines=*/true, absl::Seconds(60));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NE(s[0].object.find("stack_capture_test"), std::string::npos) << s[0].object;
  if (!addr2line_on_path()) GTEST_SKIP() << "addr2line (binutils) is not on PATH: no file:line to check";
  EXPECT_NE(s[0].function.find("park_in_pause"), std::string::npos) << s[0].function;
  EXPECT_NE(s[0].file.find("stack_capture_test.cc"), std::string::npos) << s[0].file;
  EXPECT_GT(s[0].line, 0);
}

TEST(NativeStacks, AParkedThreadAnswersWithItsFramesAndABlockingOneIsReportedSilent) {
  std::atomic<bool> done{false};
  std::atomic<int64_t> parked_tid{0};
  std::atomic<int64_t> blocking_tid{0};
  std::thread parked([&] {
    parked_tid = gettid();
    park_in_pause(done);
  });
  std::thread blocking([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, native_stack_signal());
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    blocking_tid = gettid();
    while (!done.load()) usleep(1000);
  });
  while (parked_tid.load() == 0 || blocking_tid.load() == 0) usleep(1000);

  absl::StatusOr<std::vector<RawThreadStack>> threads = capture_native_stacks(absl::Milliseconds(500));
  ASSERT_TRUE(threads.ok()) << threads.status();
  const RawThreadStack* p = nullptr;
  const RawThreadStack* b = nullptr;
  for (const RawThreadStack& t : *threads) {
    EXPECT_NE(t.tid, gettid()) << "the capturing thread leaves itself out";
    if (t.tid == parked_tid.load()) p = &t;
    if (t.tid == blocking_tid.load()) b = &t;
  }
  ASSERT_NE(p, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(b->answered);
  EXPECT_TRUE(b->pcs.empty());
  ASSERT_TRUE(p->answered);
  EXPECT_EQ(p->pthread_id, static_cast<uint64_t>(parked.native_handle()));
  EXPECT_FALSE(p->running.in_actor);
  std::vector<bool> is_return(p->pcs.size(), true);
  is_return[0] = false;
  std::vector<Symbol> symbols = symbolize(p->pcs, is_return, addr2line_on_path(), absl::Seconds(60));
  bool saw_pause = false;
  bool saw_ours = false;
  for (const Symbol& s : symbols) {
    saw_pause = saw_pause || s.function.find("pause") != std::string::npos;
    saw_ours = saw_ours || s.function.find("park_in_pause") != std::string::npos;
  }
  EXPECT_TRUE(saw_pause) << "the innermost frames are libc's pause()";
  if (addr2line_on_path()) {
    EXPECT_TRUE(saw_ours) << "the caller is this test's function";
  }

  done = true;
  pthread_kill(parked.native_handle(), native_stack_signal());  // wakes pause(); the handler ignores it
  parked.join();
  blocking.join();  // its pending signal is discarded with it (blocked until it exits)
}

TEST(NativeStacks, AThreadSilentInOneCaptureAnswersTheNextOnce) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << kTsanDefersSignals;
#endif
  // Its answer to the first capture arrives late (when it unblocks the
  // signal) and must not count for, or corrupt, the second.
  std::atomic<bool> unblock{false};
  std::atomic<bool> done{false};
  std::atomic<int64_t> tid{0};
  std::thread late([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, native_stack_signal());
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    tid = gettid();
    while (!unblock.load()) usleep(1000);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // the first capture's signal arrives now
    park_in_pause(done);
  });
  while (tid.load() == 0) usleep(1000);
  auto find = [&](const std::vector<RawThreadStack>& threads) -> const RawThreadStack* {
    const RawThreadStack* found = nullptr;
    for (const RawThreadStack& t : threads) {
      if (t.tid == tid.load()) {
        EXPECT_EQ(found, nullptr) << "one entry per thread";
        found = &t;
      }
    }
    return found;
  };
  absl::StatusOr<std::vector<RawThreadStack>> first = capture_native_stacks(absl::Milliseconds(200));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(find(*first), nullptr);
  EXPECT_FALSE(find(*first)->answered);
  unblock = true;
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<std::vector<RawThreadStack>> next = capture_native_stacks(absl::Seconds(30));
    ASSERT_TRUE(next.ok()) << next.status();
    const RawThreadStack* t = find(*next);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->answered) << "round " << round;
    EXPECT_FALSE(t->pcs.empty());
  }
  done = true;
  pthread_kill(late.native_handle(), native_stack_signal());
  late.join();
}

TEST(NativeStacks, WhileStoppedRunsWithTheAnsweredThreadsHeld) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << kTsanDefersSignals;
#endif
  // What faulthandler needs: the other threads' memory does not change
  // while it is read.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> counter{0};
  std::thread busy([&] {
    while (!done.load(std::memory_order_relaxed)) counter.fetch_add(1, std::memory_order_relaxed);
  });
  while (counter.load() == 0) usleep(1000);
  uint64_t first = 0;
  uint64_t second = 0;
  absl::StatusOr<std::vector<RawThreadStack>> threads = capture_native_stacks(absl::Seconds(30), [&] {
    first = counter.load();
    usleep(20000);  // the busy thread would count on meanwhile, were it not held
    second = counter.load();
  });
  ASSERT_TRUE(threads.ok()) << threads.status();
  bool answered = false;
  for (const RawThreadStack& t : *threads) answered = answered || (t.answered && t.pthread_id == busy.native_handle());
  EXPECT_TRUE(answered);
  EXPECT_EQ(first, second) << "the busy thread ran while it should have been held";
  const uint64_t released = counter.load();
  while (counter.load() == released) usleep(1000);  // it runs again once released
  done = true;
  busy.join();
}

TEST(PythonStacks, ParsesFaulthandlersAllThreadsText) {
  const std::string text =
      "Thread 0x00007f0a12345700 (most recent call first):\n"
      "  File \"/x/work.py\", line 12 in spin\n"
      "  File \"/x/a, b.py\", line ??? in <module>\n"
      "\n"
      "Current thread 0x00007f0a00000001 (most recent call first):\n"
      "  <no Python frame>\n"
      "Thread 0x0000000000000abc (most recent call first):\n"
      "  File \"deep.py\", line 1 in f\n"
      "  ...\n";
  std::vector<PythonThread> threads = parse_python_stacks(text);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[0].ident, 0x00007f0a12345700u);
  ASSERT_EQ(threads[0].frames.size(), 2u);
  EXPECT_EQ(threads[0].frames[0].file, "/x/work.py");
  EXPECT_EQ(threads[0].frames[0].line, 12);
  EXPECT_EQ(threads[0].frames[0].function, "spin");
  EXPECT_EQ(threads[0].frames[1].file, "/x/a, b.py");
  EXPECT_EQ(threads[0].frames[1].line, 0);
  EXPECT_EQ(threads[1].ident, 0x00007f0a00000001u);
  EXPECT_TRUE(threads[1].frames.empty());
  EXPECT_TRUE(threads[2].truncated);
  EXPECT_TRUE(parse_python_stacks("garbage\n  File \"x\", line 1 in f\n").empty());
}

TEST(PythonStacks, WithoutAnInterpreterThereIsNoPythonDump) {
  EXPECT_FALSE(raise_python_dump());
  EXPECT_EQ(read_python_dump().status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace castmesh::debug
