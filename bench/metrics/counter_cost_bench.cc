// What the always-on metrics add to one actor message (issue 40): the exact
// counting sequence ActorCell and ProcHost run per message (delivery count
// and depth maximum, taken count, one monotonic clock read after the
// handler (a batch's next handler starts where the last one ended), run
// count/time/bucket, one transport add), timed in a loop
// against the same loop without it. Single thread: the uncontended cost
// that in-process ping_pong pays per message.
//
//   build/release/bench/metrics/counter_cost_bench [iterations] [rounds]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/metrics/counters.h"

namespace {

int64_t now_ns() {  // what trace::now_ns() does (core/trace/recorder.cc)
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

volatile uint64_t sink = 0;

[[gnu::noinline]] void handler(uint64_t i) { sink = sink + i; }

double per_iteration_ns(bool counted, uint64_t iterations) {
  castmesh::metrics::ActorCounters actor;
  castmesh::metrics::FlowCounters& unix_flow = castmesh::metrics::transport(castmesh::metrics::Transport::kUnix);
  int64_t last_end = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < iterations; ++i) {
    if (counted) {
      unix_flow.in(64);
      actor.on_delivered();
      actor.on_taken();
      const int64_t t0 = last_end != 0 ? last_end : now_ns();
      handler(i);
      last_end = now_ns();
      actor.on_handled(last_end - t0);
    } else {
      handler(i);
    }
  }
  const auto end = std::chrono::steady_clock::now();
  if (counted && actor.handler_count() != iterations) std::abort();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(iterations);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5'000'000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<double> off, on;
  for (int r = 0; r < rounds; ++r) {  // alternating, so load shifts hit both
    if (r % 2 == 0) {
      off.push_back(per_iteration_ns(false, iterations));
      on.push_back(per_iteration_ns(true, iterations));
    } else {
      on.push_back(per_iteration_ns(true, iterations));
      off.push_back(per_iteration_ns(false, iterations));
    }
  }
  std::sort(off.begin(), off.end());
  std::sort(on.begin(), on.end());
  std::printf("per message: without counters %.2f ns, with %.2f ns (medians of %d rounds of %llu), added %.2f ns\n",
              off[off.size() / 2], on[on.size() / 2], rounds, static_cast<unsigned long long>(iterations),
              on[on.size() / 2] - off[off.size() / 2]);
  return 0;
}
