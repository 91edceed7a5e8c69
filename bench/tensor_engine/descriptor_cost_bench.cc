// descriptor_cost_bench: what the mismatch descriptors add to every device
// collective (device_collectives.cc, announce()): the collective number, the
// posted receive of the previous rank's descriptor and the send of this
// rank's, between two ranks of one process (the in-process mailbox path), in
// the same run as the host collective the ranks pay for anyway per call
// (an 8-byte host allreduce), for scale. No GPU needed.
//
//   descriptor_cost_bench [--iters=N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "castmesh/communicator.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/rank_mailbox.h"

namespace {

using castmesh::detail::CommGroup;
using Clock = std::chrono::steady_clock;

std::shared_ptr<CommGroup> group_of(int rank) {
  CommGroup::Layout layout;
  layout.id = "descriptor-cost-bench";
  layout.description = "descriptor cost bench";
  layout.rank = rank;
  layout.shape = *castmesh::Shape::Create({{"ranks", 2}});
  layout.self_proc = "bench-proc";
  layout.procs = {layout.self_proc, layout.self_proc};
  return CommGroup::Get(std::move(layout), /*pin=*/true);
}

// One device call's descriptor work on `g` (announce() in device_collectives.cc).
std::shared_ptr<castmesh::detail::RequestState> announce(CommGroup& g, const std::string& what) {
  // A device call makes its signature once per call, as announce() does.
  auto signature = std::make_shared<const std::string>(what);
  static const char kNoBody = 0;
  const uint64_t sequence = g.next_sequence();
  const int64_t tag = castmesh::collectives::collective_tag(sequence, castmesh::collectives::kDescriptorStep);
  auto got = g.post_recv(castmesh::collectives::Channel::kCollective, 1 - g.rank(), tag, nullptr, 0, signature);
  (void)g.start_send(castmesh::collectives::Channel::kCollective, 1 - g.rank(), tag, &kNoBody, 0, what, sequence);
  return got;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  int iters = 200000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  std::shared_ptr<CommGroup> g0 = group_of(0);
  std::shared_ptr<CommGroup> g1 = group_of(1);
  const std::string what = "device allreduce(sum, float32, count=2)";
  // Both ranks announce each call (what two ranks' device calls do); per
  // rank and call = total / (2 iters). Checked: every descriptor matched.
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    auto a = announce(*g0, what);
    auto b = announce(*g1, what);
    if (!a->done() || !b->done() || !a->test()->ok() || !b->test()->ok()) {
      std::fprintf(stderr, "descriptor %d did not match\n", i);
      return 1;
    }
  }
  const double announce_us = seconds_since(t0) * 1e6 / (2.0 * iters);
  // For scale, in the same run: an 8-byte host allreduce between the same
  // two ranks (each on its own thread), per call.
  const int host_iters = std::max(1, iters / 20);
  auto allreduce = [&](CommGroup& g) {
    double v = 1;
    auto op = castmesh::Reduction::Builtin(castmesh::ReduceOp::kSum, castmesh::DType::kFloat64);
    const auto signature = std::make_shared<const std::string>("allreduce(sum, float64, count=1)");
    for (int i = 0; i < host_iters; ++i) {
      castmesh::collectives::CollectiveCall call{&g, g.next_sequence(), signature};
      if (!castmesh::collectives::run_allreduce(call, &v, &v, 1, *op).ok()) std::abort();
    }
  };
  const Clock::time_point t1 = Clock::now();
  std::thread peer([&] { allreduce(*g1); });
  allreduce(*g0);
  peer.join();
  const double host_us = seconds_since(t1) * 1e6 / host_iters;
  std::printf("descriptor work per device call and rank: %.3f us (%d calls x 2 ranks)\n", announce_us, iters);
  std::printf("8-byte host allreduce, same two ranks:      %.3f us per call (%d calls)\n", host_us, host_iters);
  return 0;
}
