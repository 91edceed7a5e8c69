// A FAKE tensor_engine plugin for the device-collective tests on machines
// without a GPU: the real vendor-neutral plugin code (te_backend.c,
// te_engine.c) bound to FakeCuda and FakeNccl (tests/backends/tensor_engine),
// built as libcastmesh_tensor_engine.so in a folder of its own and loaded by
// the core's real loader through CASTMESH_BACKEND_PATH. Exports a few
// castmesh_fake_te_* hooks the tests reach with dlsym.
//
// CASTMESH_FAKE_TE_NCCL=missing makes the collective library load fail the
// real way (te_nccl_dlopen of a library that does not exist).
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "fake_cuda.h"
#include "te_backend.h"

namespace {

using castmesh::fakes::FakeCuda;
using castmesh::fakes::FakeNccl;

int load_fake_collectives(const char* library, te_nccl_ops* ops, char* why, size_t why_size) {
  const char* mode = std::getenv("CASTMESH_FAKE_TE_NCCL");
  if (mode != nullptr && std::strcmp(mode, "missing") == 0) return te_nccl_dlopen(library, ops, why, why_size);
  return FakeNccl::load(library, ops, why, why_size);
}

void versions(int* driver, int* runtime) {
  *driver = 12040;
  *runtime = 12040;
}
int device_count(int* count) {
  *count = 4;  // FakeCuda's devices
  return 0;
}
int32_t driver_failure(int driver, int runtime, int code, castmesh_error_v1* error) {
  return te_fail(error, CASTMESH_STATUS_NO_DRIVER, "fake driver %d / runtime %d failed with %d", driver, runtime, code);
}
int describe_device(int index, castmesh_device_info_v1* out) {
  std::snprintf(out->name, sizeof out->name, "FakeCUDA GPU %d", index);
  out->memory_bytes = uint64_t{1} << 30;
  std::snprintf(out->detail, sizeof out->detail, "fake=1");
  return 0;
}

// Never opened unless CASTMESH_FAKE_TE_NCCL=missing, and then it must fail.
const char* const kLibraries[] = {"libcastmesh-fake-absent-nccl.so.2", nullptr};

// A fake kernel that waits until the test opens it (castmesh_fake_te_hold).
struct FakeGate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
};

const te_vendor kFakeVendor = {
    .version = "0.0.0+fake",
    .device_kind = CASTMESH_DEVICE_KIND_CUDA,
    .runtime = FakeCuda::ops(),
    .load_collectives = &load_fake_collectives,
    .collective_libraries = kLibraries,
    .collective_hint = TE_NCCL_INSTALL_HINT,
    .versions = versions,
    .device_count = device_count,
    .device_count_call = "fakeGetDeviceCount",
    .no_device_code = 100,
    .driver_failure = driver_failure,
    .describe_device = describe_device,
    .describe_device_call = "fakeGetDeviceProperties",
};

}  // namespace

extern "C" {

CASTMESH_BACKEND_EXPORT const castmesh_backend_v1* castmesh_backend_init_v1(const castmesh_host_api_v1* host) {
  return te_backend_init(&kFakeVendor, host);
}

// Enqueues fn(arg) on the fake stream behind `stream`, as a kernel launch would.
CASTMESH_BACKEND_EXPORT int castmesh_fake_te_launch(castmesh_te_stream_v1* stream, void (*fn)(void*), void* arg) {
  void* native = te_stream_native(stream);
  if (native == nullptr) return -1;
  FakeCuda::launch(native, [fn, arg] { fn(arg); });
  return 0;
}

// Makes every other rank of every live communicator see rank `rank` die
// (their asynchronous error turns to ncclRemoteError).
CASTMESH_BACKEND_EXPORT void castmesh_fake_te_kill_rank(int rank) {
  FakeNccl::kill_rank_everywhere(rank);
}

// Device allocations alive now.
CASTMESH_BACKEND_EXPORT int64_t castmesh_fake_te_live_device_allocations() {
  return FakeCuda::live_device_allocations();
}

// Copies of `kind` (castmesh_te_copy_kind_v1) the fake ran so far in this process.
CASTMESH_BACKEND_EXPORT int64_t castmesh_fake_te_copies(int kind) { return FakeCuda::copies(kind); }

// Holds the fake stream whose native handle is `native` (what
// castmesh.tensor_engine.Stream.native_handle gives, for tests that reach the
// hooks through ctypes) with a kernel that waits until
// castmesh_fake_te_release(the returned gate) opens it.
CASTMESH_BACKEND_EXPORT void* castmesh_fake_te_hold(void* native) {
  auto gate = std::make_shared<FakeGate>();
  FakeCuda::launch(native, [gate] {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->cv.wait(lock, [&] { return gate->open; });
  });
  return new std::shared_ptr<FakeGate>(std::move(gate));
}

// Opens (and forgets) a gate castmesh_fake_te_hold returned; once per gate.
CASTMESH_BACKEND_EXPORT void castmesh_fake_te_release(void* handle) {
  auto* gate = static_cast<std::shared_ptr<FakeGate>*>(handle);
  {
    std::lock_guard<std::mutex> lock((*gate)->mu);
    (*gate)->open = true;
    (*gate)->cv.notify_all();
  }
  delete gate;
}

// NCCL communicators alive now.
CASTMESH_BACKEND_EXPORT int64_t castmesh_fake_te_live_comms() { return FakeNccl::live_comms(); }

}  // extern "C"
