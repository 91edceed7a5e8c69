// castmesh::debug::stacks across real worker procs (this binary
// re-executed): every proc answers, and a proc whose actor is stuck in a C
// call inside a handler shows that actor, its message and the frames.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "castmesh/debug.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"

namespace castmesh::test_debug {

struct GoStuck {
  int32_t unused = 0;
};
absl::Status encode_stuck(const GoStuck&, std::string* out) {
  out->clear();
  return absl::OkStatus();
}
absl::Status decode_stuck(std::string_view, GoStuck*) { return absl::OkStatus(); }

// Never returns: its proc is stopped (killed) at the end of the test.
[[gnu::noinline]] void stuck_in_pause() {
  for (;;) pause();  // a dump's signal wakes it; the loop parks it again
}

class Stuck : public Actor {
 public:
  void go(const GoStuck&) { stuck_in_pause(); }
  using Handlers = castmesh::Handlers<&Stuck::go>;
};

CASTMESH_REGISTER_MESSAGE(GoStuck, "castmesh.test.GoStuck", encode_stuck, decode_stuck);
CASTMESH_REGISTER_ACTOR(Stuck);

namespace {

LocalAllocatorOptions quick() {
  LocalAllocatorOptions options;
  options.join_timeout = absl::Seconds(30);
  return options;
}

TEST(StackService, EveryProcAnswersWithItsThreads) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer runs a thread's asynchronous signal handlers only when the
  // thread next reaches one of its interceptors: idle threads parked in the
  // kernel do not answer the dump's signal within the bound.
  GTEST_SKIP() << "ThreadSanitizer defers asynchronous signals to its own safe points";
#endif
  Runtime runtime;
  absl::StatusOr<ProcMesh> mesh = LocalAllocator(quick()).allocate(runtime, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<std::vector<debug::ProcStacks>> dumps = debug::stacks(*mesh, absl::Seconds(2));
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  ASSERT_EQ(dumps->size(), 2u);
  for (size_t i = 0; i < dumps->size(); ++i) {
    const debug::ProcStacks& d = (*dumps)[i];
    ASSERT_TRUE(d.status.ok()) << d.status;
    EXPECT_EQ(d.proc.id, mesh->proc(i).id);
    EXPECT_EQ(d.pid, mesh->proc(i).pid);
    ASSERT_FALSE(d.threads.empty());
    for (const debug::ThreadStack& t : d.threads) {
      EXPECT_TRUE(t.answered) << t.name;
      EXPECT_FALSE(t.has_python) << "a C++ proc has no Python side";
    }
    const std::string text = debug::to_string(d);
    EXPECT_NE(text.find("pid " + std::to_string(d.pid)), std::string::npos) << text;
  }
  EXPECT_EQ(debug::stacks(*mesh, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(mesh->stop().ok());
}

TEST(StackService, AStuckHandlerShowsItsActorMessageAndFrames) {
  Runtime runtime;
  absl::StatusOr<ProcMesh> mesh = LocalAllocator(quick()).allocate(runtime, 1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto actors = mesh->spawn<Stuck>("stuck");
  ASSERT_TRUE(actors.ok()) << actors.status();
  (*actors)[0].tell(GoStuck{});
  // Dumps until the handler has started (the hang guard is the deadline).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const debug::ThreadStack* found = nullptr;
  std::vector<debug::ProcStacks> dumps;
  while (found == nullptr && absl::Now() < deadline) {
    absl::StatusOr<std::vector<debug::ProcStacks>> got = debug::stacks(*mesh, absl::Seconds(2));
    ASSERT_TRUE(got.ok()) << got.status();
    dumps = *std::move(got);
    ASSERT_EQ(dumps.size(), 1u);
    ASSERT_TRUE(dumps[0].status.ok()) << dumps[0].status;
    for (const debug::ThreadStack& t : dumps[0].threads) {
      if (t.actor == "stuck[0]" && !t.message_type.empty()) found = &t;
    }
  }
  ASSERT_NE(found, nullptr) << debug::to_string(dumps);
  EXPECT_EQ(found->message_type, type_name<GoStuck>());
  EXPECT_NE(found->actor_class.find("Stuck"), std::string::npos) << found->actor_class;
  ASSERT_FALSE(found->native.empty());
  bool saw_pause = false;
  bool saw_ours = false;
  for (const debug::NativeFrame& f : found->native) {
    saw_pause = saw_pause || f.function.find("pause") != std::string::npos;
    saw_ours = saw_ours || f.function.find("stuck_in_pause") != std::string::npos;
  }
  const std::string text = debug::to_string(dumps);
  EXPECT_TRUE(saw_pause) << text;
  if (std::system("addr2line --version >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(saw_ours) << text;
  }
  EXPECT_NE(text.find("actor stuck[0]"), std::string::npos) << text;
  EXPECT_NE(text.find("handling " + std::string(type_name<GoStuck>())), std::string::npos) << text;
  (void)mesh->stop();  // the stuck proc is killed after the grace period
}

}  // namespace
}  // namespace castmesh::test_debug
