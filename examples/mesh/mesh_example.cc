// A 2x4 mesh of actors in one process: cast to all, slice, call, reduce, and
// watch a member fail. Prints what it does at each step.
//
//   build/dev/examples/mesh/castmesh_mesh_example
#include <cstdio>
#include <stdexcept>
#include <string>

#include "castmesh/actor_mesh.h"

namespace {

struct Add {
  int n;
};
struct Get {};
struct Crash {};

// One member: a counter that knows its place in the mesh.
class Trainer : public castmesh::Actor {
 public:
  void add(const Add& m) { value_ += m.n; }
  int get(const Get&) { return value_; }
  int crash(const Crash&) { throw std::runtime_error("simulated fault"); }
  using Handlers = castmesh::Handlers<&Trainer::add, &Trainer::get, &Trainer::crash>;

 private:
  int value_ = 0;
};

template <typename T>
void print_mesh(const char* what, const castmesh::ValueMesh<T>& values) {
  std::printf("%s over %s:\n", what, values.shape().to_string().c_str());
  for (const auto& [point, value] : values.items()) {
    std::printf("  %-20s -> %s\n", point.to_string().c_str(), std::to_string(value).c_str());
  }
}

int run() {
  castmesh::Runtime runtime;
  castmesh::Shape shape = *castmesh::Shape::Create({{"hosts", 2}, {"gpus", 4}});
  castmesh::MeshOptions options;
  options.name = "trainer";
  options.on_failure = [](const castmesh::MeshEvent& event) {
    std::printf("mesh event: %s -> continue on the survivors\n", event.to_string().c_str());
    return castmesh::MeshFailureAction::kContinue;
  };
  auto spawned = castmesh::ActorMesh<Trainer>::Spawn(runtime, shape, options);
  if (!spawned.ok()) {
    std::fprintf(stderr, "spawn failed: %s\n", spawned.status().ToString().c_str());
    return 1;
  }
  castmesh::ActorMesh<Trainer> mesh = *spawned;
  std::printf("spawned %zu actors as %s (cast fan-out %zu)\n", mesh.size(), mesh.shape().to_string().c_str(),
              mesh.fanout());

  std::printf("\ncast Add{1} to every actor\n");
  if (auto st = mesh.cast(Add{1}); !st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;

  auto gpu1 = *mesh.slice("gpus", 1);
  std::printf("cast Add{10} to the slice gpus=1: %s\n", gpu1.shape().to_string().c_str());
  (void)gpu1.cast(Add{10});
  auto even_host1 = *mesh.slice({{"hosts", 1}, {"gpus", castmesh::Range(0, 4, 2)}});
  std::printf("cast Add{100} to the slice hosts=1, gpus=0:4:2: %s\n", even_host1.shape().to_string().c_str());
  (void)even_host1.cast(Add{100});

  auto values = mesh.call(Get{}).get(absl::Seconds(10));
  if (!values.ok()) return std::fprintf(stderr, "call failed: %s\n", values.status().ToString().c_str()), 1;
  std::printf("\n");
  print_mesh("call Get{}", *values);
  std::printf("value at {hosts=1, gpus=2}: %d\n", *values->at({{"hosts", 1}, {"gpus", 2}}));

  auto total = mesh.call(Get{}, castmesh::reducers::sum<int>()).get(absl::Seconds(10));
  auto largest = mesh.call(Get{}, castmesh::reducers::max<int>()).get(absl::Seconds(10));
  std::printf("\nreduced on the way back: sum=%d max=%d\n", *total, *largest);
  auto one = mesh.slice({{"hosts", 0}, {"gpus", 1}})->call_one(Get{}).get(absl::Seconds(10));
  std::printf("call_one on {hosts=0, gpus=1}: %d\n", *one);

  std::printf("\nthe actor at {hosts=1, gpus=3} crashes while handling a call\n");
  auto crashed = mesh.slice({{"hosts", 1}, {"gpus", 3}})->call_one(Crash{}).get(absl::Seconds(10));
  std::printf("that call failed: %s\n", crashed.status().ToString().c_str());
  auto whole = mesh.call(Get{}).get(absl::Seconds(10));
  std::printf("a call to the whole mesh now fails at once: %s\n", whole.status().ToString().c_str());
  auto host0 = mesh.slice("hosts", 0)->call(Get{}).get(absl::Seconds(10));
  if (host0.ok()) print_mesh("the survivors on hosts=0 still answer", *host0);
  mesh.stop();
  std::printf("\nmesh stopped; done\n");
  return 0;
}

}  // namespace

int main() { return run(); }
