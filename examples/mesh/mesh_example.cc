// The single-controller model end to end: this program starts 8 worker procs
// (itself, re-executed) as a {hosts: 2, gpus: 4} proc mesh, spawns a Trainer
// actor in each, then casts to all, slices, calls, reduces on the way back,
// and watches a member fail and a proc die. Prints what it does at each step;
// exits non-zero if any step does not give what it should.
//
//   build/dev/examples/mesh/castmesh_mesh_example
//
// On a cluster the 8 procs come from a launcher instead and join this
// controller at a rendezvous address (docs/procs.md, "Running on a cluster"):
//
//   CASTMESH_SECRET=$SECRET castmesh_mesh_example --rendezvous tcp:0.0.0.0:29500
//   srun -N 2 --ntasks-per-node=4
//        --export=ALL,CASTMESH_RENDEZVOUS=tcp:$(hostname):29500,CASTMESH_SECRET=$SECRET
//        castmesh_mesh_example          (one command line)
//
// (run_rendezvous.sh plays srun on this machine.)
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "absl/strings/numbers.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/proc_mesh.h"

namespace {

struct Add {
  int n = 0;
};
struct Get {};
struct Pid {};
struct Crash {};
struct Exit {};

// Messages between procs need a codec (protobuf messages have one already).
absl::Status encode_add(const Add& m, std::string* out) {
  *out = std::to_string(m.n);
  return absl::OkStatus();
}
absl::Status decode_add(std::string_view bytes, Add* m) {
  return absl::SimpleAtoi(absl::string_view(bytes.data(), bytes.size()), &m->n)
             ? absl::OkStatus()
             : absl::InvalidArgumentError("Add: not a number");
}
template <typename Empty>
absl::Status encode_empty(const Empty&, std::string* out) {
  out->clear();
  return absl::OkStatus();
}
template <typename Empty>
absl::Status decode_empty(std::string_view, Empty*) {
  return absl::OkStatus();
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(Add, "castmesh.example.Add", encode_add, decode_add);
CASTMESH_REGISTER_MESSAGE(Get, "castmesh.example.Get", encode_empty<Get>, decode_empty<Get>);
CASTMESH_REGISTER_MESSAGE(Pid, "castmesh.example.Pid", encode_empty<Pid>, decode_empty<Pid>);
CASTMESH_REGISTER_MESSAGE(Crash, "castmesh.example.Crash", encode_empty<Crash>, decode_empty<Crash>);
CASTMESH_REGISTER_MESSAGE(Exit, "castmesh.example.Exit", encode_empty<Exit>, decode_empty<Exit>);

namespace {

// --8<-- [start:actor]
// One member: a counter in its own worker proc.
class Trainer : public castmesh::Actor {
 public:
  void add(const Add& m) { value_ += m.n; }
  int get(const Get&) { return value_; }
  int pid(const Pid&) { return static_cast<int>(::getpid()); }
  int crash(const Crash&) { throw std::runtime_error("simulated fault"); }
  // The whole proc dies at once, as a crash would (no goodbye to anyone).
  void exit(const Exit&) { std::_Exit(9); }
  using Handlers = castmesh::Handlers<&Trainer::add, &Trainer::get, &Trainer::pid, &Trainer::crash, &Trainer::exit>;

 private:
  int value_ = 0;
};

}  // namespace

// Worker procs spawn Trainers by this registered name.
CASTMESH_REGISTER_ACTOR(Trainer);
// --8<-- [end:actor]

namespace {

template <typename T>
void print_mesh(const char* what, const castmesh::ValueMesh<T>& values) {
  std::printf("%s over %s:\n", what, values.shape().to_string().c_str());
  for (const auto& [point, value] : values.items()) {
    std::printf("  %-20s -> %s\n", point.to_string().c_str(), std::to_string(value).c_str());
  }
}

// Prints `what` and whether it held; the example fails if any check does not.
bool check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  [ok]    " : "  [WRONG] ", what.c_str());
  return ok;
}

// The 8 procs: started here (LocalAllocator), or, with a rendezvous address,
// by a launcher and joined here (RendezvousAllocator; the secret comes from
// CASTMESH_SECRET).
absl::StatusOr<castmesh::ProcMesh> allocate(castmesh::Runtime& runtime, const castmesh::Shape& shape,
                                            const char* rendezvous) {
  if (rendezvous == nullptr) return castmesh::LocalAllocator().allocate(runtime, shape);
  castmesh::RendezvousAllocatorOptions options;
  options.listen = rendezvous;
  castmesh::RendezvousAllocator allocator(options);
  auto address = allocator.listen(runtime);
  if (!address.ok()) return address.status();
  std::printf("rendezvous at %s: waiting for %zu procs\n", address->c_str(), shape.size());
  std::fflush(stdout);
  return allocator.allocate(runtime, shape);
}

int run(castmesh::Runtime& runtime, const char* rendezvous) {
  // --8<-- [start:spawn]
  const castmesh::Shape shape = *castmesh::Shape::Create({{"hosts", 2}, {"gpus", 4}});
  auto procs = allocate(runtime, shape, rendezvous);
  if (!procs.ok()) return std::fprintf(stderr, "allocate failed: %s\n", procs.status().ToString().c_str()), 1;
  std::printf("started %zu worker procs as %s\n", procs->size(), procs->shape().to_string().c_str());

  castmesh::MeshOptions options;
  options.name = "trainer";
  options.on_failure = [](const castmesh::MeshEvent& event) {
    std::printf("mesh event: %s -> continue on the survivors\n", event.to_string().c_str());
    return castmesh::MeshFailureAction::kContinue;
  };
  auto spawned = castmesh::ActorMesh<Trainer>::Spawn(*procs, options);
  if (!spawned.ok()) return std::fprintf(stderr, "spawn failed: %s\n", spawned.status().ToString().c_str()), 1;
  castmesh::ActorMesh<Trainer> mesh = *spawned;
  // --8<-- [end:spawn]
  std::printf("spawned %zu Trainers as %s (cast fan-out %zu procs)\n", mesh.size(),
              mesh.shape().to_string().c_str(), mesh.fanout());
  bool all_ok = true;

  auto pids = mesh.call(Pid{}).get(absl::Seconds(20));
  if (!pids.ok()) return std::fprintf(stderr, "call failed: %s\n", pids.status().ToString().c_str()), 1;
  print_mesh("\neach member's process id", *pids);

  // --8<-- [start:cast]
  std::printf("\ncast Add{1} to every actor\n");
  all_ok &= check(mesh.cast(Add{1}).ok(), "cast accepted");
  auto gpu1 = *mesh.slice("gpus", 1);
  std::printf("cast Add{10} to the slice gpus=1: %s\n", gpu1.shape().to_string().c_str());
  all_ok &= check(gpu1.cast(Add{10}).ok(), "cast accepted");
  auto even_host1 = *mesh.slice({{"hosts", 1}, {"gpus", castmesh::Range(0, 4, 2)}});
  std::printf("cast Add{100} to the slice hosts=1, gpus=0:4:2: %s\n", even_host1.shape().to_string().c_str());
  all_ok &= check(even_host1.cast(Add{100}).ok(), "cast accepted");

  // Casts and calls from one sender reach each member in order, so the call
  // sees all three casts.
  auto values = mesh.call(Get{}).get(absl::Seconds(20));
  if (!values.ok()) return std::fprintf(stderr, "call failed: %s\n", values.status().ToString().c_str()), 1;
  std::printf("\n");
  print_mesh("call Get{}", *values);
  all_ok &= check(*values->at({{"hosts", 1}, {"gpus", 2}}) == 101, "value at {hosts=1, gpus=2} is 1 + 100");
  all_ok &= check(*values->at({{"hosts", 0}, {"gpus", 1}}) == 11, "value at {hosts=0, gpus=1} is 1 + 10");
  // --8<-- [end:cast]

  auto total = mesh.call(Get{}, castmesh::reducers::sum<int>()).get(absl::Seconds(20));
  auto largest = mesh.call(Get{}, castmesh::reducers::max<int>()).get(absl::Seconds(20));
  if (!total.ok() || !largest.ok()) return std::fprintf(stderr, "reduction failed\n"), 1;
  std::printf("\nreduced on the way back up the tree of procs: sum=%d max=%d\n", *total, *largest);
  all_ok &= check(*total == 8 + 2 * 10 + 2 * 100 && *largest == 101, "sum is 228 and max is 101");
  auto one = mesh.slice({{"hosts", 0}, {"gpus", 1}})->call_one(Get{}).get(absl::Seconds(20));
  all_ok &= check(one.ok() && *one == 11, "call_one on {hosts=0, gpus=1} gives 11");

  std::printf("\nthe actor at {hosts=1, gpus=3} crashes while handling a call\n");
  auto crashed = mesh.slice({{"hosts", 1}, {"gpus", 3}})->call_one(Crash{}).get(absl::Seconds(20));
  std::printf("that call failed: %s\n", crashed.status().ToString().c_str());
  all_ok &= check(!crashed.ok(), "the crash came back as an error");

  auto whole = mesh.call(Get{}).get(absl::Seconds(20));
  std::printf("a call to the whole mesh fails: %s\n", whole.status().ToString().c_str());
  all_ok &= check(!whole.ok(), "the call failed, naming the point");

  const auto victim = procs->proc(2);  // {hosts=0, gpus=2}
  if (rendezvous == nullptr) {
    std::printf("\nSIGKILL the worker proc of {hosts=0, gpus=2} (pid %lld)\n", static_cast<long long>(victim.pid));
    ::kill(static_cast<pid_t>(victim.pid), SIGKILL);
  } else {
    // Not our child, maybe not on this machine: it ends itself.
    std::printf("\nthe worker proc of {hosts=0, gpus=2} (pid %lld on %s) dies\n", static_cast<long long>(victim.pid),
                victim.hostname.c_str());
    mesh.slice({{"hosts", 0}, {"gpus", 2}})->cast(Exit{}).IgnoreError();
  }
  auto host0 = mesh.slice("hosts", 0)->call(Get{}).get(absl::Seconds(20));
  std::printf("a call to the slice hosts=0 fails promptly: %s\n", host0.status().ToString().c_str());
  all_ok &= check(!host0.ok(), "the call failed instead of hanging");
  auto survivors = mesh.slice({{"hosts", 0}, {"gpus", castmesh::Range(0, 2)}})->call(Get{}).get(absl::Seconds(20));
  if (survivors.ok()) print_mesh("the survivors on hosts=0, gpus=0:2 still answer", *survivors);
  all_ok &= check(survivors.ok(), "survivors answer");

  mesh.stop();
  if (absl::Status stopped = procs->stop(); !stopped.ok()) std::printf("stop: %s\n", stopped.ToString().c_str());
  std::printf("\nmesh and procs stopped; %s\n", all_ok ? "every step gave what it should" : "SOME STEPS WENT WRONG");
  return all_ok ? 0 : 1;
}

}  // namespace

// --8<-- [start:main]
int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // in a worker proc this serves and never returns
  const char* rendezvous = nullptr;
  if (argc == 3 && std::strcmp(argv[1], "--rendezvous") == 0) {
    rendezvous = argv[2];
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--rendezvous tcp:HOST:PORT]\n", argv[0]);
    return 2;
  }
  castmesh::Runtime runtime;
  return run(runtime, rendezvous);
}
// --8<-- [end:main]
