// The `debug.stacks` proc service (docs/observability.md, "Stack dumps"):
// answers a StackDumpRequest with this proc's stack dump (stack_dump.h).
// A dump waits for threads and runs addr2line, so it runs on the service's
// own thread (started on the first request), never on the I/O thread;
// requests are answered one after another.
//
// Threading: the handler runs on the host's I/O thread and only queues;
// the dump thread sends the replies; detach() (host destructor) joins it.
#pragma once

#include <cstdint>
#include <deque>
#include <thread>

#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/debug.pb.h"
#include "core/proc/proc_service.h"

namespace castmesh::proc {
class ProcHost;
}  // namespace castmesh::proc

namespace castmesh::debug {

inline constexpr char kStackService[] = "debug.stacks";

class StackService : public proc::ProcService {
 public:
  explicit StackService(proc::ProcHost& host);
  ~StackService() override;

  void detach() override;

 private:
  struct Request {
    ProcId peer;
    uint64_t correlation = 0;
    wire::v1::StackDumpRequest request;
  };
  void on_request(const ProcId& peer, uint64_t correlation, const std::string& payload);
  void run();

  proc::ProcHost& host_;
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::debug
