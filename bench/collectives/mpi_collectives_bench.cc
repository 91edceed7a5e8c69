// The collectives benchmark, MPI side: the peer castmesh_collectives_bench is
// compared with. The same measurements (collective_suite.cc) over
// MPI_Allreduce, MPI_Bcast, MPI_Allgather, MPI_Barrier and MPI_Send/MPI_Recv on
// MPI_COMM_WORLD. Run it as `mpirun -n 4 mpi_collectives_bench`, or both
// with run_collectives_bench.sh.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collective_suite.h"

namespace {

// The suite's calls on MPI_COMM_WORLD (between MPI_Init and MPI_Finalize; any failure aborts the job).
class MpiLibrary final : public castmesh_bench::CollectiveLibrary {
 public:
  MpiLibrary() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes (checked below) instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }

  std::string name() const override { return "MPI"; }
  std::vector<std::string> describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, static_cast<size_t>(length));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return {text};
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void barrier() override { check("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD)); }
  void allreduce_sum(const float* in, float* out, size_t count) override {
    check("MPI_Allreduce", MPI_Allreduce(in, out, count_of(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check("MPI_Bcast", MPI_Bcast(data, count_of(bytes), MPI_BYTE, root, MPI_COMM_WORLD));
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    check("MPI_Allgather",
          MPI_Allgather(in, count_of(bytes), MPI_BYTE, out, count_of(bytes), MPI_BYTE, MPI_COMM_WORLD));
  }
  void send(const void* data, size_t bytes, int dest) override {
    check("MPI_Send", MPI_Send(data, count_of(bytes), MPI_BYTE, dest, 0, MPI_COMM_WORLD));
  }
  void recv(void* data, size_t bytes, int source) override {
    check("MPI_Recv", MPI_Recv(data, count_of(bytes), MPI_BYTE, source, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  }
  // MPI's blocking calls poll; an idle rank polls a non-blocking barrier
  // once a millisecond instead, leaving the cores to the measured ranks.
  void idle_barrier() override {
    MPI_Request request;
    check("MPI_Ibarrier", MPI_Ibarrier(MPI_COMM_WORLD, &request));
    for (int done = 0;;) {
      check("MPI_Test", MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      if (done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::vector<double> gather_to_root(const std::vector<double>& values) override {
    std::vector<double> all(rank_ == 0 ? values.size() * static_cast<size_t>(size_) : 0);
    check("MPI_Gather", MPI_Gather(values.data(), count_of(values.size()), MPI_DOUBLE, all.data(),
                                   count_of(values.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
    return all;
  }
  [[noreturn]] void abort_job(const std::string& why) override {
    std::fprintf(stderr, "rank %d: %s\n", rank_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; this tells the compiler so
  }

 private:
  int count_of(size_t n) {
    if (n > static_cast<size_t>(INT_MAX)) abort_job("count " + std::to_string(n) + " exceeds MPI's int counts");
    return static_cast<int>(n);
  }
  void check(const char* what, int code) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    abort_job(std::string(what) + ": " + std::string(text, static_cast<size_t>(length)));
  }

  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  castmesh_bench::SuiteOptions options;
  std::string error;
  if (!castmesh_bench::parse_suite_options(argc, argv, options, error)) {
    if (!error.empty()) std::fprintf(stderr, "%s\n", error.c_str());
    std::fprintf(stderr, "%s", castmesh_bench::suite_usage("mpi_collectives_bench").c_str());
    return error.empty() ? 0 : 2;
  }
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    MpiLibrary library;
    code = castmesh_bench::run_suite(library, options);
  }
  MPI_Finalize();
  return code;
}
