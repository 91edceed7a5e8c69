// RendezvousAllocator: procs started by a launcher join a controller. The
// test plays the launcher (srun, mpirun, mpiexec, a Kubernetes indexed Job):
// it starts this same binary as the workers with the variables such a
// launcher sets; castmesh::init in main() turns them into worker procs that
// join the controller (this test) over TCP loopback. Also: the parsing of
// those variables (LaunchEnv), without processes.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "castmesh/actor.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/platform/process.h"
#include "core/proc/launch_env.h"
#include "core/testing/supervision_events.h"
#include "core/testing/test_messages.h"
#include "core/transport/endpoint.h"

namespace {

using namespace std::chrono_literals;

struct WhoAreYou {};  // answered with "pid rank-variable-value"
struct Hold {};       // answered after 20 s (the test kills the proc meanwhile)

using castmesh::testing::decode_empty;
using castmesh::testing::encode_empty;

}  // namespace

CASTMESH_REGISTER_MESSAGE(WhoAreYou, "test.rendezvous.WhoAreYou", encode_empty, decode_empty);
CASTMESH_REGISTER_MESSAGE(Hold, "test.rendezvous.Hold", encode_empty, decode_empty);

// Says which process it runs in and which rank the launcher gave it.
class Member : public castmesh::Actor {
 public:
  explicit Member(std::string tag) : tag_(std::move(tag)) {}
  std::string who(const WhoAreYou&) {
    const char* launcher_rank = std::getenv("TEST_LAUNCHER_RANK");
    return absl::StrCat(::getpid(), " ", launcher_rank != nullptr ? launcher_rank : "?", " ", tag_);
  }
  std::string hold(const Hold&) {
    std::this_thread::sleep_for(20s);
    return "late";
  }
  using Handlers = castmesh::Handlers<&Member::who, &Member::hold>;

 private:
  std::string tag_;
};
CASTMESH_REGISTER_ACTOR(Member, std::string);

namespace {

constexpr char kSecret[] = "rendezvous-test-secret";

using Vars = std::vector<std::pair<std::string, std::string>>;

// Plays the launcher: starts this binary as worker procs with the given
// variables (and none of the test's own launcher or castmesh variables),
// and kills and reaps whatever is still running at the end.
class Launcher {
 public:
  ~Launcher() {
    for (pid_t pid : running_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (const auto& [pid, log] : logs_) {
      ::unlink(log.c_str());
      ::unlink((log + ".out").c_str());
    }
  }

  // Starts one worker; its stderr goes to a file (stderr_of(pid)).
  pid_t start(const Vars& vars) {
    std::vector<std::string> env;
    for (char** e = castmesh::platform::environment(); *e != nullptr; ++e) {
      std::string_view entry(*e);
      if (entry.starts_with("CASTMESH_") || entry.starts_with("OMPI_") || entry.starts_with("PMI_") ||
          entry.starts_with("SLURM_") || entry.starts_with("JOB_COMPLETION_INDEX=")) {
        continue;
      }
      env.emplace_back(entry);
    }
    std::map<std::string, std::string> chosen;  // a later value of a variable replaces an earlier one
    for (const auto& [key, value] : vars) chosen[key] = value;
    for (const auto& [key, value] : chosen) env.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log = absl::StrCat(::testing::TempDir(), "rendezvous-worker-", ::getpid(), "-", next_++, ".err");
    absl::StatusOr<std::string> self = castmesh::platform::executable_path();
    EXPECT_TRUE(self.ok()) << self.status();
    if (!self.ok()) return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (log + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    char* argv[] = {self->data(), nullptr};
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, self->c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0);
    running_.push_back(pid);
    logs_[pid] = log;
    return pid;
  }

  // A worker as srun starts it: SLURM_PROCID / SLURM_NTASKS.
  pid_t start_srun_task(const std::string& rendezvous, int rank, int ntasks, Vars extra = {}) {
    Vars vars = {{"CASTMESH_RENDEZVOUS", rendezvous},
                 {"CASTMESH_SECRET", kSecret},
                 {"SLURM_PROCID", std::to_string(rank)},
                 {"SLURM_NTASKS", std::to_string(ntasks)},
                 {"TEST_LAUNCHER_RANK", std::to_string(rank)}};
    for (auto& v : extra) vars.push_back(std::move(v));
    return start(vars);
  }

  // The exit status (as waitpid gives it) once `pid` exits, or nullopt
  // after `timeout` (the process is then left running).
  std::optional<int> wait_exit(pid_t pid, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(running_, pid);
        return status;
      }
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }

  std::string stderr_of(pid_t pid) { return read_file(logs_[pid]); }

  // The first stdout line of `pid` starting with `prefix` (without it), once
  // written; "" if none within `timeout`.
  std::string wait_stdout_line(pid_t pid, const std::string& prefix, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::istringstream lines(read_file(logs_[pid] + ".out"));
      for (std::string line; std::getline(lines, line);) {
        if (line.starts_with(prefix) && !lines.eof()) return line.substr(prefix.size());
      }
      std::this_thread::sleep_for(10ms);
    }
    return "";
  }

 private:
  static std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::vector<pid_t> running_;
  std::map<pid_t, std::string> logs_;
  int next_ = 0;
};

castmesh::RendezvousAllocatorOptions loopback_options(absl::Duration join_timeout = absl::Seconds(30)) {
  castmesh::RendezvousAllocatorOptions options;
  options.listen = "tcp:127.0.0.1:0";
  options.secret = kSecret;
  options.join_timeout = join_timeout;
  return options;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

bool contains(absl::string_view text, absl::string_view part) { return text.find(part) != absl::string_view::npos; }

using Events = castmesh::testing::SupervisionEvents;

// A fake proc in this process that joins with whatever it is told to say
// and then ignores everything (including Stop): what a broken or foreign
// worker looks like to the controller.
class FakeProc {
 public:
  FakeProc() {
    castmesh::transport::EndpointOptions options;
    options.listen = "tcp:127.0.0.1:0";
    options.secret = kSecret;
    auto endpoint = castmesh::transport::Endpoint::start(
        options,
        [this](const std::string&, castmesh::wire::v1::FrameHeader&& frame_header, castmesh::wire::Payload payload) {
          if (frame_header.message_type() == castmesh::wire::v1::Stop().GetTypeName()) {
            std::lock_guard lock(mu_);
            stopped_ = true;
            cv_.notify_all();
            return;
          }
          if (frame_header.message_type() != castmesh::wire::v1::JoinReply().GetTypeName()) return;
          castmesh::wire::v1::JoinReply reply;
          reply.ParseFromString(std::string(payload.view()));
          std::lock_guard lock(mu_);
          reply_ = reply;
          cv_.notify_all();
        });
    EXPECT_TRUE(endpoint.ok()) << endpoint.status();
    endpoint_ = std::move(*endpoint);
  }

  // Sends Join until the answer is not "no allocation is waiting" (as a
  // worker does); the final answer.
  std::optional<castmesh::wire::v1::JoinReply> join(const std::string& controller, uint32_t rank,
                                                    uint32_t world_size) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      {
        std::lock_guard lock(mu_);
        reply_.reset();
      }
      send_join(controller, rank, world_size);
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, 10s, [&] { return reply_.has_value(); });
      if (!reply_ || reply_->error_code() != static_cast<int>(absl::StatusCode::kUnavailable)) return reply_;
      lock.unlock();
      std::this_thread::sleep_for(50ms);
    }
    return std::nullopt;
  }

  void send_join(const std::string& controller, uint32_t rank, uint32_t world_size) {
    castmesh::wire::v1::Join join;
    join.set_rank(rank);
    join.set_world_size(world_size);
    join.set_pid(::getpid());
    join.set_hostname("fake-host");
    castmesh::wire::v1::FrameHeader frame_header;
    frame_header.set_kind(castmesh::wire::v1::FrameHeader::KIND_CONTROL);
    frame_header.set_message_type(join.GetTypeName());
    frame_header.set_correlation(1);
    ASSERT_TRUE(
        endpoint_->send(controller, frame_header, castmesh::wire::Payload::adopt(join.SerializeAsString())).ok());
  }

  const std::string& id() const { return endpoint_->id(); }

  // Goes away at once: its connections close (what a crash looks like).
  void vanish() { endpoint_.reset(); }

  // True once the controller sent Stop (within `timeout`).
  bool told_to_stop(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::optional<castmesh::wire::v1::JoinReply> reply_;
  std::unique_ptr<castmesh::transport::Endpoint> endpoint_;
};

// --- joining and using the mesh ---------------------------------------------

TEST(RendezvousAllocator, SrunStyleProcsJoinInAnyOrderAndTakeTheirReportedRanks) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_TRUE(address->starts_with("tcp:127.0.0.1:")) << *address;
  EXPECT_NE(*address, "tcp:127.0.0.1:0");

  // Started before allocate() waits (they retry), out of rank order.
  Launcher launcher;
  std::map<int, pid_t> pid_of_rank;
  for (int rank : {2, 0, 3, 1}) {
    pid_of_rank[rank] = launcher.start_srun_task(*address, rank, 4);
    std::this_thread::sleep_for(30ms);
  }
  auto shape = castmesh::Shape::Create({{"hosts", 2}, {"gpus", 2}});
  ASSERT_TRUE(shape.ok());
  auto mesh = allocator.allocate(runtime, *shape);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_EQ(mesh->size(), 4u);
  EXPECT_EQ(mesh->shape().sizes(), shape->sizes());
  for (int rank = 0; rank < 4; ++rank) {
    const castmesh::ProcInfo& proc = mesh->proc(static_cast<size_t>(rank));
    EXPECT_EQ(proc.rank, rank);
    EXPECT_EQ(proc.pid, pid_of_rank[rank]) << "rank " << rank;
    EXPECT_TRUE(proc.id.starts_with("tcp:127.0.0.1:")) << proc.id;
    EXPECT_FALSE(proc.hostname.empty());
  }

  auto members = mesh->spawn<Member>("member", std::string("m"));
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& ref = (*members)[static_cast<size_t>(rank)];
    EXPECT_EQ(ref.address().index, static_cast<uint64_t>(rank));
    auto who = ref.ask(WhoAreYou{}).get(absl::Seconds(10));
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(*who, absl::StrCat(pid_of_rank[rank], " ", rank, " m"));
  }
  // A slice keeps the reported ranks.
  auto second_host = mesh->slice("hosts", 1);
  ASSERT_TRUE(second_host.ok());
  ASSERT_EQ(second_host->size(), 2u);
  EXPECT_EQ(second_host->proc(0).rank, 2);
  EXPECT_EQ(second_host->proc(1).pid, pid_of_rank[3]);

  // stop() asks them to exit; they are the launcher's children, not ours.
  ASSERT_TRUE(mesh->stop().ok());
  for (const auto& [rank, pid] : pid_of_rank) {
    auto status = launcher.wait_exit(pid, 10s);
    ASSERT_TRUE(status.has_value()) << "rank " << rank << " still running after stop()";
    EXPECT_EQ(exit_code(*status), 0) << launcher.stderr_of(pid);
  }
}

TEST(RendezvousAllocator, MpirunMpiexecAndKubernetesVariablesWithAWildcardListener) {
  castmesh::RendezvousAllocatorOptions options = loopback_options();
  options.listen = "tcp:0.0.0.0:0";
  options.advertise_host = "127.0.0.1";
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(options);
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_TRUE(address->starts_with("tcp:127.0.0.1:")) << *address;  // advertised, not 0.0.0.0

  const Vars common = {{"CASTMESH_RENDEZVOUS", *address}, {"CASTMESH_SECRET", kSecret}};
  auto with = [&](Vars vars) {
    vars.insert(vars.end(), common.begin(), common.end());
    return vars;
  };
  Launcher launcher;
  std::map<int, pid_t> pid_of_rank;
  // Kubernetes indexed Job: the index, and the size from CASTMESH_WORLD_SIZE.
  pid_of_rank[2] = launcher.start(
      with({{"JOB_COMPLETION_INDEX", "2"}, {"CASTMESH_WORLD_SIZE", "3"}, {"TEST_LAUNCHER_RANK", "2"}}));
  // MPICH / Hydra mpiexec.
  pid_of_rank[1] = launcher.start(with({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"TEST_LAUNCHER_RANK", "1"}}));
  // Open MPI mpirun inside a Slurm allocation: Open MPI's rank wins over
  // the SLURM_PROCID of the step that runs mpirun.
  pid_of_rank[0] = launcher.start(with({{"OMPI_COMM_WORLD_RANK", "0"},
                                        {"OMPI_COMM_WORLD_SIZE", "3"},
                                        {"SLURM_PROCID", "2"},
                                        {"SLURM_NTASKS", "1"},
                                        {"TEST_LAUNCHER_RANK", "0"}}));
  auto mesh = allocator.allocate(runtime, 3);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto members = mesh->spawn<Member>("member", std::string("k"));
  ASSERT_TRUE(members.ok()) << members.status();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(mesh->proc(static_cast<size_t>(rank)).pid, pid_of_rank[rank]);
    auto who = (*members)[static_cast<size_t>(rank)].ask(WhoAreYou{}).get(absl::Seconds(10));
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(*who, absl::StrCat(pid_of_rank[rank], " ", rank, " k"));
  }
  ASSERT_TRUE(mesh->stop().ok());
}

// --- launch errors ------------------------------------------------------------

TEST(RendezvousAllocator, DuplicateRankFailsTheAllocationNamingBothProcs) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  Launcher launcher;
  const pid_t zero = launcher.start_srun_task(*address, 0, 3);
  const pid_t one = launcher.start_srun_task(*address, 1, 3);
  const pid_t other_one = launcher.start_srun_task(*address, 1, 3);  // and no rank 2
  auto mesh = allocator.allocate(runtime, 3);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kAlreadyExists) << mesh.status();
  EXPECT_TRUE(contains(mesh.status().message(), "rank 1 joined twice")) << mesh.status();
  EXPECT_TRUE(contains(mesh.status().message(), absl::StrCat("pid ", one))) << mesh.status();
  EXPECT_TRUE(contains(mesh.status().message(), absl::StrCat("pid ", other_one))) << mesh.status();
  // The refused proc exits with an error; the rank 1 that was accepted is
  // let go. (Rank 0 may not have joined yet when the allocation failed: it
  // then keeps trying until its own join timeout, for a later allocate().)
  (void)zero;
  int refused = 0;
  for (pid_t pid : {one, other_one}) {
    auto status = launcher.wait_exit(pid, 20s);
    ASSERT_TRUE(status.has_value()) << "pid " << pid << " still running";
    if (exit_code(*status) != 0) {
      ++refused;
      EXPECT_EQ(exit_code(*status), 1);
      EXPECT_TRUE(contains(launcher.stderr_of(pid), "rank 1 joined twice")) << launcher.stderr_of(pid);
    }
  }
  EXPECT_EQ(refused, 1);
}

TEST(RendezvousAllocator, ProcLaunchedForAnotherMeshSizeFailsTheAllocation) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  Launcher launcher;
  const pid_t wrong = launcher.start_srun_task(*address, 0, 3);  // srun -n 3 for a mesh of 2
  auto mesh = allocator.allocate(runtime, 2);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument) << mesh.status();
  EXPECT_TRUE(contains(mesh.status().message(), "launched for a mesh of 3 procs; this allocation is for 2"))
      << mesh.status();
  auto status = launcher.wait_exit(wrong, 20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), 1);
  EXPECT_TRUE(contains(launcher.stderr_of(wrong), "this allocation is for 2")) << launcher.stderr_of(wrong);
}

TEST(RendezvousAllocator, RankOutOfRangeIsRefusedByTheController) {
  // A worker checks its own rank against its world size (LaunchEnv below);
  // the controller checks again, for procs that do not.
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  FakeProc fake;
  std::optional<absl::StatusOr<castmesh::ProcMesh>> mesh;
  std::thread allocating([&] { mesh = allocator.allocate(runtime, 2); });
  auto reply = fake.join(*address, 7, 2);
  allocating.join();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->error_code(), static_cast<int>(absl::StatusCode::kOutOfRange)) << reply->error_message();
  ASSERT_FALSE(mesh->ok());
  EXPECT_EQ(mesh->status().code(), absl::StatusCode::kOutOfRange) << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), "rank 7, out of range for a mesh of 2")) << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), fake.id())) << mesh->status();
}

TEST(RendezvousAllocator, WrongSecretIsRefusedAndDoesNotCount) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  Launcher launcher;
  // An intruder claiming rank 0 first: it gives up after its join timeout.
  const pid_t intruder = launcher.start_srun_task(
      *address, 0, 2, {{"CASTMESH_SECRET", "not-the-secret"}, {"CASTMESH_JOIN_TIMEOUT", "2"}});
  std::this_thread::sleep_for(100ms);
  const pid_t zero = launcher.start_srun_task(*address, 0, 2);
  const pid_t one = launcher.start_srun_task(*address, 1, 2);
  auto mesh = allocator.allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->proc(0).pid, zero);
  EXPECT_EQ(mesh->proc(1).pid, one);
  auto status = launcher.wait_exit(intruder, 20s);
  ASSERT_TRUE(status.has_value()) << "the intruder did not give up";
  EXPECT_EQ(exit_code(*status), 1);
  EXPECT_TRUE(contains(launcher.stderr_of(intruder), "could not join the controller")) << launcher.stderr_of(intruder);
  ASSERT_TRUE(mesh->stop().ok());
}

TEST(RendezvousAllocator, TimeoutNamesTheRanksThatNeverJoinedAndReleasesTheOthers) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options(absl::Seconds(3)));
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  // Ranks 0 and 2 join (fake procs in this process, so they surely join
  // before the timeout); ranks 1 and 3 never come.
  FakeProc zero, two;
  std::optional<absl::StatusOr<castmesh::ProcMesh>> mesh;
  std::thread allocating([&] { mesh = allocator.allocate(runtime, 4); });
  auto zero_joined = zero.join(*address, 0, 4);
  auto two_joined = two.join(*address, 2, 4);
  allocating.join();
  ASSERT_TRUE(zero_joined.has_value() && two_joined.has_value());
  EXPECT_EQ(zero_joined->error_code(), 0) << zero_joined->error_message();
  EXPECT_EQ(two_joined->error_code(), 0) << two_joined->error_message();
  ASSERT_FALSE(mesh->ok());
  EXPECT_EQ(mesh->status().code(), absl::StatusCode::kDeadlineExceeded) << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), "ranks 1, 3 of a mesh of 4 did not join " + *address))
      << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), "joined: rank 0, pid")) << mesh->status();
  // The procs that joined are told to go.
  EXPECT_TRUE(zero.told_to_stop(10s));
  EXPECT_TRUE(two.told_to_stop(10s));
}

TEST(RendezvousAllocator, WorkerWithBadLauncherVariablesExitsWithAClearError) {
  Launcher launcher;
  const Vars common = {{"CASTMESH_RENDEZVOUS", "tcp:127.0.0.1:1"}, {"CASTMESH_SECRET", kSecret}};
  Vars not_a_number = common;
  not_a_number.insert(not_a_number.end(), {{"SLURM_PROCID", "abc"}, {"SLURM_NTASKS", "2"}});
  Vars too_big = common;
  too_big.insert(too_big.end(), {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  const pid_t bad_number = launcher.start(not_a_number);
  const pid_t bad_rank = launcher.start(too_big);
  auto status = launcher.wait_exit(bad_number, 20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), 2);
  EXPECT_TRUE(contains(launcher.stderr_of(bad_number), "SLURM_PROCID='abc' is not a non-negative integer"))
      << launcher.stderr_of(bad_number);
  status = launcher.wait_exit(bad_rank, 20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), 2);
  EXPECT_TRUE(contains(launcher.stderr_of(bad_rank), "rank 4 is not below the world size 4")) << launcher.stderr_of(bad_rank);
}

TEST(RendezvousAllocator, ClearErrorsForBadOptions) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocatorOptions no_listen;
  no_listen.secret = kSecret;
  auto a = castmesh::RendezvousAllocator(no_listen).listen(runtime);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(contains(a.status().message(), "listen is required")) << a.status();
  castmesh::RendezvousAllocatorOptions no_secret;
  no_secret.listen = "tcp:127.0.0.1:0";
  if (std::getenv("CASTMESH_SECRET") == nullptr) {
    auto b = castmesh::RendezvousAllocator(no_secret).listen(runtime);
    ASSERT_FALSE(b.ok());
    EXPECT_TRUE(contains(b.status().message(), "mesh secret")) << b.status();
  }
  castmesh::RendezvousAllocator listening(loopback_options());  // keeps the runtime listening
  auto first = listening.listen(runtime);
  ASSERT_TRUE(first.ok()) << first.status();
  // A runtime is one proc with one address.
  castmesh::RendezvousAllocatorOptions elsewhere = loopback_options();
  elsewhere.listen = "tcp:127.0.0.1:1";
  auto c = castmesh::RendezvousAllocator(elsewhere).listen(runtime);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "already a proc at " + *first)) << c.status();
  castmesh::RendezvousAllocatorOptions same = loopback_options();
  same.listen.clear();
  auto d = castmesh::RendezvousAllocator(same).listen(runtime);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, *first);
}

// --- failures after the join --------------------------------------------------

TEST(RendezvousAllocator, KilledProcIsReportedLikeALocalOne) {
  Events events;
  castmesh::RendezvousAllocatorOptions options = loopback_options();
  options.on_supervision_event = events.handler();
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(options);
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  Launcher launcher;
  const pid_t one = launcher.start_srun_task(*address, 1, 2);
  launcher.start_srun_task(*address, 0, 2);
  auto mesh = allocator.allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto members = mesh->spawn<Member>("member", std::string("x"));
  ASSERT_TRUE(members.ok()) << members.status();
  auto pending = (*members)[1].ask(Hold{});
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(::kill(one, SIGKILL), 0);
  auto result = pending.get(absl::Seconds(10));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_TRUE(contains(result.status().message(), mesh->proc(1).id)) << result.status();
  EXPECT_TRUE(contains(result.status().message(), "rank 1")) << result.status();
  auto event = events.wait_for_child((*members)[1].address());
  ASSERT_TRUE(event.has_value());
  EXPECT_TRUE(contains(event->reason.message(), mesh->proc(1).id)) << event->reason;
  auto alive = (*members)[0].ask(WhoAreYou{}).get(absl::Seconds(10));
  ASSERT_TRUE(alive.ok()) << alive.status();
  // stop(): the dead proc is already gone, the live one exits.
  EXPECT_TRUE(mesh->stop().ok());
}

TEST(RendezvousAllocator, ProcLostBeforeTheMeshIsCompleteFailsTheAllocation) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  FakeProc fake;
  const std::string fake_id = fake.id();
  std::optional<absl::StatusOr<castmesh::ProcMesh>> mesh;
  std::thread allocating([&] { mesh = allocator.allocate(runtime, 2); });
  auto reply = fake.join(*address, 0, 2);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->error_code(), 0) << reply->error_message();
  fake.vanish();  // rank 1 never comes; rank 0 is gone
  allocating.join();
  ASSERT_FALSE(mesh->ok());
  EXPECT_EQ(mesh->status().code(), absl::StatusCode::kUnavailable) << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), fake_id)) << mesh->status();
  EXPECT_TRUE(contains(mesh->status().message(), "joined and was lost before the mesh was complete")) << mesh->status();
}

TEST(RendezvousAllocator, WorkerExitsWhenItsControllerIsKilled) {
  // The controller is another process here (this binary in the role
  // "rendezvous-controller"); the worker is the launcher's, not its child,
  // so only the lost connection can tell the worker.
  Launcher launcher;
  const pid_t controller = launcher.start({{"CASTMESH_TEST_ROLE", "rendezvous-controller"}});
  const std::string address = launcher.wait_stdout_line(controller, "address ", 30s);
  ASSERT_FALSE(address.empty()) << launcher.stderr_of(controller);
  const pid_t worker = launcher.start_srun_task(address, 0, 1);
  ASSERT_EQ(launcher.wait_stdout_line(controller, "joined ", 30s), std::to_string(worker))
      << launcher.stderr_of(controller);
  ASSERT_EQ(::kill(controller, SIGKILL), 0);
  ASSERT_TRUE(launcher.wait_exit(controller, 10s).has_value());
  auto status = launcher.wait_exit(worker, 20s);
  ASSERT_TRUE(status.has_value()) << "the worker outlived its controller";
  EXPECT_EQ(exit_code(*status), 0) << launcher.stderr_of(worker);
}

TEST(RendezvousAllocator, StopReportsAProcThatDoesNotExitInsteadOfKillingIt) {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  ASSERT_TRUE(address.ok()) << address.status();
  FakeProc fake;  // joins, then ignores Stop
  std::optional<absl::StatusOr<castmesh::ProcMesh>> mesh;
  std::thread allocating([&] { mesh = allocator.allocate(runtime, 1); });
  auto reply = fake.join(*address, 0, 1);
  allocating.join();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->error_code(), 0) << reply->error_message();
  ASSERT_TRUE(mesh->ok()) << mesh->status();
  EXPECT_EQ((*mesh)->proc(0).hostname, "fake-host");
  absl::Status stopped = (*mesh)->stop();
  EXPECT_EQ(stopped.code(), absl::StatusCode::kDeadlineExceeded) << stopped;
  EXPECT_TRUE(contains(stopped.message(), fake.id())) << stopped;
  EXPECT_TRUE(contains(stopped.message(), "started by a launcher")) << stopped;
}

// --- the worker's environment -------------------------------------------------

absl::StatusOr<castmesh::proc::WorkerLaunch> parse(std::map<std::string, std::string> vars) {
  return castmesh::proc::worker_launch_from([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::map<std::string, std::string> rendezvous_vars(std::map<std::string, std::string> more) {
  more.emplace("CASTMESH_RENDEZVOUS", "tcp:127.0.0.1:29500");
  more.emplace("CASTMESH_SECRET", "s");
  return more;
}

TEST(LaunchEnv, TlsFilesComeFromTheirVariablesAsPaths) {
  auto launch = parse(rendezvous_vars({{"CASTMESH_RANK", "0"}, {"CASTMESH_WORLD_SIZE", "1"}}));
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_FALSE(launch->tls.enabled());
  launch = parse(rendezvous_vars({{"CASTMESH_RANK", "0"},
                                  {"CASTMESH_WORLD_SIZE", "1"},
                                  {"CASTMESH_TLS_CA", "/certs/ca.crt"},
                                  {"CASTMESH_TLS_CERT", "/certs/h.crt"},
                                  {"CASTMESH_TLS_KEY", "/certs/h.key"}}));
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->tls.ca_file, "/certs/ca.crt");
  EXPECT_EQ(launch->tls.cert_file, "/certs/h.crt");
  EXPECT_EQ(launch->tls.key_file, "/certs/h.key");
}

TEST(LaunchEnv, RankAndSizeComeFromTheFirstLauncherThatSetsThem) {
  auto slurm = parse(rendezvous_vars({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}}));
  ASSERT_TRUE(slurm.ok()) << slurm.status();
  EXPECT_EQ(slurm->rank, 3);
  EXPECT_EQ(slurm->world_size, 8);
  EXPECT_EQ(slurm->controller, "tcp:127.0.0.1:29500");
  EXPECT_FALSE(slurm->started_by_controller);
  EXPECT_EQ(slurm->listen, "tcp:127.0.0.1:0");  // the route to a loopback controller

  auto ompi = parse(rendezvous_vars(
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(ompi.ok()) << ompi.status();
  EXPECT_EQ(ompi->rank, 1);
  EXPECT_EQ(ompi->world_size, 2);

  auto pmi = parse(rendezvous_vars({{"PMI_RANK", "0"}, {"PMI_SIZE", "5"}}));
  ASSERT_TRUE(pmi.ok()) << pmi.status();
  EXPECT_EQ(pmi->world_size, 5);

  auto explicit_rank = parse(rendezvous_vars(
      {{"CASTMESH_RANK", "2"}, {"CASTMESH_WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(explicit_rank.ok()) << explicit_rank.status();
  EXPECT_EQ(explicit_rank->rank, 2);
  EXPECT_EQ(explicit_rank->world_size, 4);

  // CASTMESH_WORLD_SIZE overrides the launcher's size (e.g. fewer procs
  // than tasks are meant to join).
  auto overridden = parse(rendezvous_vars({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"CASTMESH_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->world_size, 2);

  auto kubernetes = parse(rendezvous_vars({{"JOB_COMPLETION_INDEX", "4"}, {"CASTMESH_WORLD_SIZE", "6"}}));
  ASSERT_TRUE(kubernetes.ok()) << kubernetes.status();
  EXPECT_EQ(kubernetes->rank, 4);
  EXPECT_EQ(kubernetes->world_size, 6);

  auto timeout = parse(rendezvous_vars({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"CASTMESH_JOIN_TIMEOUT", "7"}}));
  ASSERT_TRUE(timeout.ok()) << timeout.status();
  EXPECT_EQ(timeout->join_timeout, absl::Seconds(7));
}

TEST(LaunchEnv, BadValuesAreClearErrors) {
  auto expect_error = [](std::map<std::string, std::string> vars, const std::string& part) {
    auto launch = parse(std::move(vars));
    ASSERT_FALSE(launch.ok()) << "expected an error mentioning '" << part << "'";
    EXPECT_EQ(launch.status().code(), absl::StatusCode::kInvalidArgument) << launch.status();
    EXPECT_TRUE(contains(launch.status().message(), part)) << launch.status();
  };
  expect_error(rendezvous_vars({{"SLURM_PROCID", "two"}, {"SLURM_NTASKS", "4"}}),
               "SLURM_PROCID='two' is not a non-negative integer");
  expect_error(rendezvous_vars({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "4"}}), "SLURM_PROCID='-1'");
  expect_error(rendezvous_vars({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4x"}}), "SLURM_NTASKS='4x'");
  expect_error(rendezvous_vars({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "2"}}),
               "rank 5 is not below the world size 2 (SLURM_PROCID=5, SLURM_NTASKS=2)");
  expect_error(rendezvous_vars({{"JOB_COMPLETION_INDEX", "0"}}), "set CASTMESH_WORLD_SIZE");
  expect_error(rendezvous_vars({}), "no rank in the environment");
  expect_error(rendezvous_vars({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}), "world size 0");
  expect_error({{"CASTMESH_RENDEZVOUS", "tcp:127.0.0.1:1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}},
               "CASTMESH_SECRET");
  expect_error(rendezvous_vars({{"CASTMESH_RENDEZVOUS", "host:1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}),
               "CASTMESH_RENDEZVOUS='host:1'");
  expect_error(rendezvous_vars({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"CASTMESH_JOIN_TIMEOUT", "soon"}}),
               "CASTMESH_JOIN_TIMEOUT='soon'");
}

TEST(LaunchEnv, WhereAWorkerListens) {
  auto advertised = parse(rendezvous_vars(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"CASTMESH_ADVERTISE_HOST", "node7.cluster"}}));
  ASSERT_TRUE(advertised.ok()) << advertised.status();
  EXPECT_EQ(advertised->listen, "tcp:0.0.0.0:0");
  EXPECT_EQ(advertised->advertise_host, "node7.cluster");
  auto unix_rendezvous =
      parse(rendezvous_vars({{"CASTMESH_RENDEZVOUS", "unix:@ctl"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(unix_rendezvous.ok()) << unix_rendezvous.status();
  EXPECT_EQ(unix_rendezvous->listen, "");  // a fresh Unix address (abstract on Linux)
  // A LocalAllocator's child keeps its controller's choices.
  auto local = parse({{"CASTMESH_BOOTSTRAP", "unix:@ctl"}, {"CASTMESH_SECRET", "s"}, {"CASTMESH_RANK", "1"},
                      {"CASTMESH_WORLD_SIZE", "2"}, {"CASTMESH_TRANSPORT", "tcp"}});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->started_by_controller);
  EXPECT_EQ(local->listen, "tcp:127.0.0.1:0");
  auto address = castmesh::proc::local_address_towards("127.0.0.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
  EXPECT_FALSE(castmesh::proc::local_address_towards("no-such-host.invalid").ok());
}

// Role "rendezvous-controller" (WorkerExitsWhenItsControllerIsKilled):
// waits for one proc, says so, and waits to be killed.
int run_controller_role() {
  castmesh::Runtime runtime;
  castmesh::RendezvousAllocator allocator(loopback_options());
  auto address = allocator.listen(runtime);
  if (!address.ok()) return std::fprintf(stderr, "%s\n", address.status().ToString().c_str()), 1;
  std::printf("address %s\n", address->c_str());
  std::fflush(stdout);
  auto mesh = allocator.allocate(runtime, 1);
  if (!mesh.ok()) return std::fprintf(stderr, "%s\n", mesh.status().ToString().c_str()), 1;
  std::printf("joined %lld\n", static_cast<long long>(mesh->proc(0).pid));
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);  // killed long before
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // the launched workers never return from here
  if (const char* role = std::getenv("CASTMESH_TEST_ROLE"); role != nullptr && std::string(role) == "rendezvous-controller") {
    return run_controller_role();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
