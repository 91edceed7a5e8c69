// An MPI-style SPMD program on castmesh's Communicator, no controller:
// every process runs main(), finds the others through rank 0, averages a
// "gradient" with allreduce, shares rank 0's step count with broadcast,
// gathers every rank's loss on rank 0, and passes a token around a ring.
// Exits non-zero if any result is wrong.
//
//   mpirun -n 4 build/dev/examples/collectives/castmesh_spmd_allreduce
//   srun -n 4 castmesh_spmd_allreduce          (Slurm; CASTMESH_RENDEZVOUS for several hosts)
//   sh examples/collectives/run_spmd.sh build/dev/examples/collectives/castmesh_spmd_allreduce 4
//
// (run_spmd.sh plays the launcher: it starts N copies with CASTMESH_RANK and
// CASTMESH_WORLD_SIZE set.)
#include <cstdio>
#include <numeric>
#include <vector>

#include "castmesh/communicator.h"

namespace {

bool check(bool ok, const char* what, int rank) {
  std::printf("rank %d: %-40s %s\n", rank, what, ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  // --8<-- [start:world]
  absl::StatusOr<castmesh::Communicator> world = castmesh::Communicator::world();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 2;
  }
  castmesh::Communicator& comm = *world;
  // --8<-- [end:world]
  const int rank = comm.rank(), size = comm.size();
  using castmesh::DType;
  using castmesh::TensorView;
  bool ok = true;

  // --8<-- [start:allreduce]
  // Average a 1M-element gradient (the ring algorithm; single copy between
  // processes of this host).
  std::vector<float> grad(1 << 20, static_cast<float>(rank));
  TensorView g = TensorView::Contiguous(grad.data(), DType::kFloat32, {static_cast<int64_t>(grad.size())});
  absl::Status st = comm.allreduce(g, g, castmesh::ReduceOp::kAvg);
  ok &= check(st.ok() && grad.front() == (size - 1) / 2.0f && grad.back() == grad.front(), "allreduce(avg) of 4 MiB", rank);
  // --8<-- [end:allreduce]

  int64_t step = rank == 0 ? 1234 : 0;
  st = comm.broadcast(TensorView::Contiguous(&step, DType::kInt64, {1}), 0);
  ok &= check(st.ok() && step == 1234, "broadcast from rank 0", rank);

  double loss = 0.5 * rank;
  std::vector<double> losses(size);
  st = comm.gather(TensorView::Contiguous(&loss, DType::kFloat64, {1}),
                   TensorView::Contiguous(losses.data(), DType::kFloat64, {size}), 0);
  ok &= check(st.ok() && (rank != 0 || losses.back() == 0.5 * (size - 1)), "gather to rank 0", rank);

  int32_t token = rank, from_left = -1;
  castmesh::Request incoming =
      comm.irecv(TensorView::Contiguous(&from_left, DType::kInt32, {1}), (rank + size - 1) % size, /*tag=*/7);
  st = comm.send(TensorView::Contiguous(&token, DType::kInt32, {1}), (rank + 1) % size, /*tag=*/7);
  ok &= check(st.ok() && incoming.wait(absl::Seconds(30)).ok() && from_left == (rank + size - 1) % size,
              "ring of send/irecv", rank);
  return ok ? 0 : 1;
}
