// The collectives benchmark's measurements, shared by the castmesh program
// (collectives_bench.cc) and its Open MPI peer (mpi_collectives_bench.cc) so
// both run the same sizes, iteration policy, checks and output: each program
// only implements CollectiveLibrary over its library's calls.
//
// Measured per size: float32 sum allreduce, broadcast from rank 0, allgather,
// ping-pong between ranks 0 and 1, and a single-process memcpy floor; barrier
// latency once. Every figure is the median over samples of the slowest rank's
// mean time per call in a batch of calls (the samples start together after a
// barrier); the samples are gathered to rank 0 after timing, through the
// library itself. Bus bandwidth follows NCCL-tests (allreduce 2(n-1)/n, allgather
// (n-1)/n of the algorithm bandwidth; allgather's size is the gathered buffer).
//
// Plain C++20 with no castmesh or MPI dependency.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace castmesh_bench {

// The calls one library provides. Every rank calls each collective in the
// same order (SPMD); a failure ends the whole job through abort_job.
class CollectiveLibrary {
 public:
  virtual ~CollectiveLibrary() = default;
  // "castmesh" or "MPI": the label of the library's figures.
  virtual std::string name() const = 0;
  // Lines describing the library's setup (version, transports), printed once.
  virtual std::vector<std::string> describe() const = 0;
  // This rank (0..size-1) and the number of ranks.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Returns once every rank has entered it.
  virtual void barrier() = 0;
  // out[i] = sum over ranks of in[i]; in and out do not overlap.
  virtual void allreduce_sum(const float* in, float* out, size_t count) = 0;
  // Root's `bytes` at `data` land in every rank's `data`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // `bytes` from each rank land in out at rank * bytes.
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;
  // Blocking point-to-point send and receive of exactly `bytes`.
  virtual void send(const void* data, size_t bytes, int dest) = 0;
  virtual void recv(void* data, size_t bytes, int source) = 0;
  // A barrier that a rank with nothing to do waits in without spinning, so
  // that ranks which sit out a measurement (ping-pong, memcpy) leave the
  // machine's cores to those measured.
  virtual void idle_barrier() = 0;
  // Rank 0 gets every rank's `values` (the same count everywhere), by rank;
  // the other ranks get an empty vector.
  virtual std::vector<double> gather_to_root(const std::vector<double>& values) = 0;
  // Ends every rank of the job with `why` (printed with this rank).
  [[noreturn]] virtual void abort_job(const std::string& why) = 0;
};

// Command-line choices; the same flags for both programs.
struct SuiteOptions {
  // The largest size measured (sizes are fixed: 8 B, 64 B, 256 B, ... 64 MiB).
  size_t max_bytes = size_t{64} << 20;
  // Fewer samples and calls per sample: a smoke run, not a measurement.
  bool quick = false;
  // Tab-separated rows for run_collectives_bench.sh instead of tables.
  bool tsv = false;
  // Ops to run (allreduce, broadcast, allgather, barrier, pingpong, memcpy); empty: all.
  std::vector<std::string> ops;
};

// Parses argv (after the program name). On a bad flag returns false and sets
// `error`; `--help` returns false with the usage in `error`.
bool parse_suite_options(int argc, char** argv, SuiteOptions& options, std::string& error);

// The flags parse_suite_options accepts, for usage messages.
std::string suite_usage(const std::string& program);

// Runs every selected measurement on this rank; rank 0 prints the results.
// Returns the process exit code (0 when every result checked out).
int run_suite(CollectiveLibrary& library, const SuiteOptions& options);

}  // namespace castmesh_bench
