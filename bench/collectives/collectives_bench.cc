// The collectives benchmark, castmesh side: an SPMD program on
// castmesh::Communicator::world(), started like any MPI program
// (`mpirun -n 4 castmesh_collectives_bench`; mpirun only sets the rank
// variables). mpi_collectives_bench measures the same with Open MPI;
// run_collectives_bench.sh runs both and prints them side by side. The
// measurements themselves are in collective_suite.cc.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "castmesh/communicator.h"
#include "castmesh/version.h"
#include "collective_suite.h"

namespace {

using castmesh::Communicator;
using castmesh::DType;
using castmesh::TensorView;

// A byte view of caller memory (the suite owns every buffer).
TensorView bytes_view(const void* data, size_t bytes) {
  return TensorView::Contiguous(const_cast<void*>(data), DType::kUInt8, {static_cast<int64_t>(bytes)});
}

// The suite's calls on a castmesh communicator (blocking calls; any failure ends the job).
class CastmeshLibrary final : public castmesh_bench::CollectiveLibrary {
 public:
  explicit CastmeshLibrary(Communicator comm) : comm_(std::move(comm)) {}

  std::string name() const override { return "castmesh"; }
  std::vector<std::string> describe() const override {
    std::vector<std::string> lines = {std::string("castmesh ") + castmesh::version() +
                                      ", Communicator::world() over the proc transport"};
    for (const char* variable :
         {"CASTMESH_RENDEZVOUS", "CASTMESH_SHM", "CASTMESH_SINGLE_COPY", "CASTMESH_REDUCTION_ISA"}) {
      if (const char* value = std::getenv(variable); value != nullptr) lines.push_back(std::string(variable) + "=" + value);
    }
    return lines;
  }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }

  void barrier() override { check("barrier", comm_.barrier()); }
  void allreduce_sum(const float* in, float* out, size_t count) override {
    const auto n = static_cast<int64_t>(count);
    check("allreduce", comm_.allreduce(TensorView::Contiguous(const_cast<float*>(in), DType::kFloat32, {n}),
                                       TensorView::Contiguous(out, DType::kFloat32, {n}), castmesh::ReduceOp::kSum));
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check("broadcast", comm_.broadcast(bytes_view(data, bytes), root));
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    check("allgather", comm_.allgather(bytes_view(in, bytes), bytes_view(out, bytes * static_cast<size_t>(size()))));
  }
  void send(const void* data, size_t bytes, int dest) override {
    check("send", comm_.send(bytes_view(data, bytes), dest));
  }
  void recv(void* data, size_t bytes, int source) override {
    absl::StatusOr<castmesh::MessageStatus> got = comm_.recv(bytes_view(data, bytes), source);
    check("recv", got.status());
    if (got->bytes != bytes) abort_job("recv got " + std::to_string(got->bytes) + " bytes, want " + std::to_string(bytes));
  }
  // A castmesh barrier already blocks without spinning.
  void idle_barrier() override { barrier(); }
  std::vector<double> gather_to_root(const std::vector<double>& values) override {
    const auto n = static_cast<int64_t>(values.size());
    std::vector<double> all(rank() == 0 ? values.size() * static_cast<size_t>(size()) : 0);
    TensorView out = rank() == 0 ? TensorView::Contiguous(all.data(), DType::kFloat64, {n * size()}) : TensorView();
    check("gather", comm_.gather(TensorView::Contiguous(const_cast<double*>(values.data()), DType::kFloat64, {n}), out, 0));
    return all;
  }
  [[noreturn]] void abort_job(const std::string& why) override {
    // The other ranks see this process go and fail their pending calls.
    std::fprintf(stderr, "rank %d: %s\n", comm_.rank(), why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }

 private:
  void check(const char* what, const absl::Status& status) {
    if (!status.ok()) abort_job(std::string(what) + ": " + status.ToString());
  }

  Communicator comm_;
};

}  // namespace

int main(int argc, char** argv) {
  castmesh_bench::SuiteOptions options;
  std::string error;
  if (!castmesh_bench::parse_suite_options(argc, argv, options, error)) {
    if (!error.empty()) std::fprintf(stderr, "%s\n", error.c_str());
    std::fprintf(stderr, "%s", castmesh_bench::suite_usage("castmesh_collectives_bench").c_str());
    return error.empty() ? 0 : 2;
  }
  absl::StatusOr<Communicator> world = Communicator::world();
  if (!world.ok()) {
    std::fprintf(stderr, "castmesh_collectives_bench: %s\n(start it with mpirun -n N, srun, or the variables of "
                         "docs/collectives.md)\n",
                 world.status().ToString().c_str());
    return 1;
  }
  CastmeshLibrary library(*world);
  return castmesh_bench::run_suite(library, options);
}
