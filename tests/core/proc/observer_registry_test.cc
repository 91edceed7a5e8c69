// ObserverRegistry: the proc layer's one registry of observers (lost peers
// in ProcHost, reported failures in RemoteSupervision).
#include "core/proc/observer_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace castmesh::proc {
namespace {

TEST(ObserverRegistry, EveryObserverIsToldUntilRemoved) {
  ObserverRegistry<std::string, int> registry;
  std::vector<std::string> told;
  const uint64_t a =
      registry.add([&](const std::string& peer, const int& n) { told.push_back("a:" + peer + std::to_string(n)); });
  const uint64_t b =
      registry.add([&](const std::string& peer, const int& n) { told.push_back("b:" + peer + std::to_string(n)); });
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  registry.notify("p", 1);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(std::count(told.begin(), told.end(), "a:p1"), 1);
  EXPECT_EQ(std::count(told.begin(), told.end(), "b:p1"), 1);
  registry.remove(a);
  registry.remove(12345);  // unknown: ignored
  told.clear();
  registry.notify("q", 2);
  EXPECT_EQ(told, std::vector<std::string>{"b:q2"});
}

TEST(ObserverRegistry, AnObserverMayRemoveItselfWhileTold) {
  ObserverRegistry<int> registry;
  int calls = 0;
  uint64_t id = 0;
  id = registry.add([&](const int&) {
    ++calls;
    registry.remove(id);  // no deadlock: observers run without the lock
  });
  registry.notify(1);
  registry.notify(2);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace castmesh::proc
