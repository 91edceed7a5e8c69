// Communicator::world(): SPMD processes started the way a launcher starts
// them (this binary re-executed with Open MPI's or Slurm's rank variables),
// which find each other through rank 0 and then run collectives; a rank
// that never comes makes rank 0 fail naming it. (world() under the real
// `mpirun` runs in the CTest test bench.collectives.vs_mpi.smoke.)
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/communicator.h"

extern char** environ;

namespace castmesh {
namespace {

constexpr char kChildVariable[] = "CASTMESH_TEST_WORLD_CHILD";

// The SPMD program every rank runs; exit code 0 when every check held.
int rank_main() {
  absl::StatusOr<Communicator> comm = Communicator::world();
  if (!comm.ok()) {
    fprintf(stderr, "world: %s\n", comm.status().ToString().c_str());
    return 10;
  }
  std::vector<int64_t> v(1000);
  std::iota(v.begin(), v.end(), comm->rank());
  TensorView t = TensorView::Contiguous(v.data(), DType::kInt64, {1000});
  if (absl::Status st = comm->allreduce(t, t, ReduceOp::kSum); !st.ok()) {
    fprintf(stderr, "allreduce: %s\n", st.ToString().c_str());
    return 11;
  }
  const int n = comm->size();
  const int64_t want = 999LL * n + n * (n - 1) / 2;
  if (v.back() != want) {
    fprintf(stderr, "rank %d: got %lld, want %lld\n", comm->rank(), static_cast<long long>(v.back()),
            static_cast<long long>(want));
    return 12;
  }
  // Point to point around the ring.
  int64_t mine = comm->rank(), left = -1;
  Request r = comm->irecv(TensorView::Contiguous(&left, DType::kInt64, {1}), (comm->rank() + n - 1) % n, 3);
  if (!comm->send(TensorView::Contiguous(&mine, DType::kInt64, {1}), (comm->rank() + 1) % n, 3).ok()) return 13;
  if (!r.wait(absl::Seconds(30)).ok() || left != (comm->rank() + n - 1) % n) return 14;
  return 0;
}

// Starts `n` ranks of this binary with `launcher` variables, waits for all.
std::vector<int> run_ranks(int n, int started, const std::vector<std::pair<std::string, std::string>>& launcher,
                           const std::string& rank_variable) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < started; ++rank) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.push_back(absl::StrCat(kChildVariable, "=1"));
    env_strings.push_back(absl::StrCat(rank_variable, "=", rank));
    for (const auto& [k, v] : launcher) env_strings.push_back(absl::StrCat(k, "=", v));
    std::vector<char*> env;
    for (auto& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    char* argv[] = {exe.data(), nullptr};
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, env.data()), 0);
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  (void)n;
  return codes;
}

// A socket file (abstract names exist only on Linux; the portable path is
// tested too).
std::string fresh_rendezvous() {
  const char* tmp = std::getenv("TMPDIR");
  return absl::StrCat("unix:", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/cm-world-test-", ::getpid(), "-",
                      std::random_device()() % 100000);
}

TEST(World, OpenMpiVariablesFourRanks) {
  auto codes = run_ranks(4, 4,
                         {{"OMPI_COMM_WORLD_SIZE", "4"}, {"CASTMESH_RENDEZVOUS", fresh_rendezvous()},
                          {"CASTMESH_SECRET", "s3cret"}},
                         "OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(codes, std::vector<int>(4, 0));
}

// Slurm's variables, no rendezvous or secret given: the single-host
// defaults derived from the job id.
TEST(World, SlurmVariablesWithSingleHostDefaults) {
  auto codes = run_ranks(3, 3,
                         {{"SLURM_NTASKS", "3"}, {"SLURM_JOB_ID", absl::StrCat("t", ::getpid())},
                          {"SLURM_STEP_ID", "0"}},
                         "SLURM_PROCID");
  EXPECT_EQ(codes, std::vector<int>(3, 0));
}

// Only ranks 0 and 1 of 3 start: both fail (rank 0 names rank 2), no hang.
TEST(World, MissingRankIsAnErrorNotAHang) {
  auto codes = run_ranks(3, 2,
                         {{"OMPI_COMM_WORLD_SIZE", "3"}, {"CASTMESH_RENDEZVOUS", fresh_rendezvous()},
                          {"CASTMESH_SECRET", "s3cret"}, {"CASTMESH_JOIN_TIMEOUT", "2"}},
                         "OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(codes, std::vector<int>(2, 10));
}

TEST(World, NoLauncherIsAClearError) {
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("SLURM_PROCID") != nullptr) GTEST_SKIP();
  auto world = Communicator::world();
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument) << world.status();
  EXPECT_NE(world.status().message().find("mpirun"), std::string::npos) << world.status();
}

}  // namespace
}  // namespace castmesh

int main(int argc, char** argv) {
  if (std::getenv(castmesh::kChildVariable) != nullptr) return castmesh::rank_main();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
