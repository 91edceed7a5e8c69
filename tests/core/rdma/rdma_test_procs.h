// Test support shared by the RDMA buffer tests that run worker procs
// (rdma_buffer_test, rdma_device_staging_fake_test, the FakeNic tests): an
// environment variable set for one test, and stopping a worker for real.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "castmesh/config.h"

namespace castmesh::rdma_test {

// Sets an environment variable for one test (worker procs inherit it), and
// has this process read its settings again (castmesh/config.h reads the
// environment once): a malformed value then fails the next RDMA operation.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    ::setenv(name, value, 1);
    (void)castmesh::config::reload_environment();
  }
  ~ScopedEnv() {
    ::unsetenv(name_);
    (void)castmesh::config::reload_environment();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Whether every thread of process `pid` is stopped (a signal takes effect
// asynchronously; a thread running on another core could still answer one
// more message).
inline bool all_threads_stopped(int64_t pid) {
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') return false;
  }
  return !error;
}

// Stops process `pid` (SIGSTOP) and waits until every thread of it is stopped.
inline void stop_process(int64_t pid) {
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGSTOP), 0);
  for (int i = 0; i < 500; ++i) {
    if (all_threads_stopped(pid)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "process " << pid << " did not stop";
}

}  // namespace castmesh::rdma_test
