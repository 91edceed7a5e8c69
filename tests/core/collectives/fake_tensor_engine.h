// Test support for device collectives over the FAKE tensor_engine plugin
// (fake_tensor_engine_plugin.cc): points the core's loader at the plugin's
// folder, reaches its castmesh_fake_te_* hooks, and runs a scenario on every
// member of an in-process actor mesh (each member a rank on its own fake GPU).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "castmesh/actor_mesh.h"
#include "castmesh/backend.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"
#include "core/testing/scenario_mesh.h"

namespace castmesh::testing {

// The fake plugin's hooks (see fake_tensor_engine_plugin.cc).
struct FakeEngineHooks {
  int (*launch)(castmesh_te_stream_v1*, void (*)(void*), void*) = nullptr;
  void (*kill_rank)(int) = nullptr;
  int64_t (*live_device_allocations)() = nullptr;
  int64_t (*live_comms)() = nullptr;
  int64_t (*copies)(int kind) = nullptr;  // copies of a castmesh_te_copy_kind_v1 so far
};

// Loads the fake plugin through the core's loader (once per process) and
// returns its hooks; fails the test when that does not work.
inline const FakeEngineHooks& fake_engine() {
  static const FakeEngineHooks hooks = [] {
    FakeEngineHooks h;
    setenv("CASTMESH_BACKEND_PATH", CASTMESH_FAKE_TE_DIR, 1);
    absl::StatusOr<const Backend*> backend = load_backend("tensor_engine");
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return h;
    EXPECT_EQ((*backend)->info().version, "0.0.0+fake") << "not the fake plugin: " << (*backend)->info().path;
    void* lib = dlopen((*backend)->info().path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(lib, nullptr) << dlerror();
    if (lib == nullptr) return h;
    h.launch = reinterpret_cast<decltype(h.launch)>(dlsym(lib, "castmesh_fake_te_launch"));
    h.kill_rank = reinterpret_cast<decltype(h.kill_rank)>(dlsym(lib, "castmesh_fake_te_kill_rank"));
    h.live_device_allocations =
        reinterpret_cast<decltype(h.live_device_allocations)>(dlsym(lib, "castmesh_fake_te_live_device_allocations"));
    h.live_comms = reinterpret_cast<decltype(h.live_comms)>(dlsym(lib, "castmesh_fake_te_live_comms"));
    h.copies = reinterpret_cast<decltype(h.copies)>(dlsym(lib, "castmesh_fake_te_copies"));
    EXPECT_TRUE(h.launch != nullptr && h.kill_rank != nullptr && h.live_device_allocations != nullptr &&
                h.live_comms != nullptr && h.copies != nullptr);
    return h;
  }();
  return hooks;
}

using Outcome = testing::ScenarioOutcome<double>;
using Scenario = testing::ScenarioFn<double>;
inline Outcome fail(const absl::Status& st) { return testing::scenario_error<double>(st); }

// A gate a fake kernel waits on: the stream stays busy until it opens.
// Test threads release it; the fake stream's thread waits.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  static void wait(void* arg) {
    Gate* g = static_cast<Gate*>(arg);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [g] { return g->open; });
  }
};

// The device of rank `rank`: one fake GPU per rank.
inline Device gpu(int rank) { return Device{DeviceKind::kCuda, rank}; }

// Runs `scenario` on every member of a fresh n-member mesh; one outcome per rank.
class FakeDeviceMeshTest : public testing::ScenarioMeshTest<double> {
 protected:
  FakeDeviceMeshTest() : ScenarioMeshTest("gpu", 8) { fake_engine(); }
};

// Copies a device tensor to the host (through a stream of its device) and
// returns its elements as doubles.
template <typename T>
absl::StatusOr<std::vector<double>> to_host(const TensorView& t) {
  std::vector<T> host(static_cast<size_t>(t.numel()));
  absl::StatusOr<DeviceStream> s = DeviceStream::Create(t.device());
  if (!s.ok()) return s.status();
  TensorView h = TensorView::Contiguous(host.data(), t.dtype(), {t.numel()});
  if (absl::Status st = device_copy(h, t, *s); !st.ok()) return st;
  if (absl::Status st = s->synchronize(); !st.ok()) return st;
  return std::vector<double>(host.begin(), host.end());
}

// A device tensor on `device` holding `values`.
template <typename T>
absl::StatusOr<TensorView> on_device(const std::vector<T>& values, DType dtype, Device device) {
  absl::StatusOr<TensorView> t = device_empty(dtype, {static_cast<int64_t>(values.size())}, device);
  if (!t.ok()) return t.status();
  absl::StatusOr<DeviceStream> s = DeviceStream::Create(device);
  if (!s.ok()) return s.status();
  std::vector<T> copy = values;
  TensorView h = TensorView::Contiguous(copy.data(), dtype, {static_cast<int64_t>(copy.size())});
  if (absl::Status st = device_copy(*t, h, *s); !st.ok()) return st;
  if (absl::Status st = s->synchronize(); !st.ok()) return st;
  return t;
}

}  // namespace castmesh::testing
