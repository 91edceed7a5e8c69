// The worker-proc test harness (worker_procs.h). Linked, with
// worker_procs_main.cc, into every castmesh_add_gtest(... WORKER_PROCS)
// binary, so the member and its message are registered in every proc.
#include "core/testing/worker_procs.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_join.h"

namespace castmesh::testing {
namespace {

absl::Status encode_run(const RunProcScenario& m, std::string* out) {
  *out = m.name;
  return absl::OkStatus();
}
absl::Status decode_run(std::string_view b, RunProcScenario* m) {
  m->name = std::string(b);
  return absl::OkStatus();
}

// Filled at static initialisation, read-only afterwards.
std::map<std::string, ProcScenarioFn>& scenarios() {
  static auto* all = new std::map<std::string, ProcScenarioFn>();
  return *all;
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(RunProcScenario, "castmesh.test.RunProcScenario", encode_run, decode_run);
CASTMESH_REGISTER_ACTOR(ProcScenarioMember);

bool register_proc_scenarios(std::vector<std::pair<std::string, ProcScenarioFn>> list) {
  for (auto& [name, fn] : list) {
    if (!scenarios().emplace(name, std::move(fn)).second) {
      std::fprintf(stderr, "proc scenario %s registered twice\n", name.c_str());
      std::abort();  // two tests of one binary chose the same name
    }
  }
  return true;
}

ProcScenarioFn joined(ProcScenarioNumbersFn fn) {
  return [fn](Communicator& c, std::string& out) {
    std::vector<double> got;
    absl::Status st = fn(c, got);
    out = absl::StrJoin(got, ",");
    return st;
  };
}

std::string ProcScenarioMember::run(const RunProcScenario& m) {
  absl::StatusOr<Communicator> comm = Communicator::current();
  if (!comm.ok()) return "ERR " + comm.status().ToString();
  auto it = scenarios().find(m.name);
  if (it == scenarios().end()) return "ERR no proc scenario named " + m.name;
  std::string out;
  if (absl::Status st = it->second(*comm, out); !st.ok()) return "ERR " + st.ToString();
  return out.empty() ? "OK" : "OK " + out;
}

namespace {

// Sets environment variables for a scope, restoring what was there.
class EnvForScope {
 public:
  explicit EnvForScope(const std::vector<std::pair<std::string, std::string>>& env) {
    for (const auto& [name, value] : env) {
      const char* old = std::getenv(name.c_str());
      saved_.push_back({name, old == nullptr ? std::nullopt : std::optional<std::string>(old)});
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~EnvForScope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }
  EnvForScope(const EnvForScope&) = delete;
  EnvForScope& operator=(const EnvForScope&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

WorkerProcs::WorkerProcs(int n, WorkerProcsOptions options) : continue_on_failure_(options.continue_on_failure) {
  EnvForScope env(options.env);
  LocalAllocatorOptions allocator;
  allocator.transport = options.transport;
  auto procs = LocalAllocator(std::move(allocator)).allocate(runtime_, n);
  EXPECT_TRUE(procs.ok()) << procs.status();
  if (procs.ok()) procs_.emplace(std::move(*procs));
}

WorkerProcs::~WorkerProcs() { (void)stop(); }

absl::Status WorkerProcs::stop() {
  if (!procs_ || stopped_) return absl::OkStatus();
  stopped_ = true;
  return procs_->stop();
}

ActorMesh<ProcScenarioMember>* WorkerProcs::members() {
  if (members_) return &*members_;
  if (!procs_) return nullptr;
  MeshOptions options{.name = "member"};
  if (continue_on_failure_) options.on_failure = [](const MeshEvent&) { return MeshFailureAction::kContinue; };
  auto mesh = ActorMesh<ProcScenarioMember>::Spawn(*procs_, options);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  if (!mesh.ok()) return nullptr;
  members_.emplace(std::move(*mesh));
  return &*members_;
}

std::vector<std::string> WorkerProcs::run(const std::string& scenario, absl::Duration timeout) {
  ActorMesh<ProcScenarioMember>* mesh = members();
  if (mesh == nullptr) return {};
  auto replies = mesh->call(RunProcScenario{scenario}).get(timeout);
  EXPECT_TRUE(replies.ok()) << replies.status();
  return replies.ok() ? replies->values() : std::vector<std::string>{};
}

int WorkerProcs::run_with_dead_rank(const std::string& scenario, int dead, absl::Duration per_reply,
                                    const std::function<void(int, const std::string&)>& check_survivor) {
  ActorMesh<ProcScenarioMember>* mesh = members();
  if (mesh == nullptr) return 0;
  auto stream = mesh->stream(RunProcScenario{scenario});
  int answered = 0;
  for (size_t i = 0; i < procs_->size(); ++i) {
    auto next = stream.next(per_reply);  // a bound against a hang, not a timing check
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok()) return answered;
    const auto& [point, reply] = *next;
    if (static_cast<int>(point.rank()) == dead) {
      EXPECT_FALSE(reply.ok());  // its proc died
      continue;
    }
    EXPECT_TRUE(reply.ok()) << "rank " << point.rank() << ": " << reply.status();
    if (!reply.ok()) return answered;
    check_survivor(static_cast<int>(point.rank()), *reply);
    ++answered;
  }
  return answered;
}

std::vector<std::string> run_on_worker_procs(int n, const std::string& scenario, absl::Duration timeout,
                                             WorkerProcsOptions options) {
  WorkerProcs procs(n, std::move(options));
  if (!procs.ok()) return {};
  std::vector<std::string> replies = procs.run(scenario, timeout);
  EXPECT_TRUE(procs.stop().ok());
  return replies;
}

void expect_error_naming(const std::string& reply, const std::string& what, int rank) {
  EXPECT_NE(reply.find("ERR"), std::string::npos) << "rank " << rank << ": " << reply;
  EXPECT_NE(reply.find(what), std::string::npos) << "rank " << rank << ": " << reply;
}

}  // namespace castmesh::testing
