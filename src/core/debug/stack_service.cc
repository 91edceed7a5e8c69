#include "core/debug/stack_service.h"

#include <algorithm>
#include <utility>

#include "core/debug/stack_dump.h"
#include "core/platform/process.h"
#include "core/proc/proc_host.h"
#include "core/wire/status_code.h"

namespace castmesh::debug {
namespace {

namespace v1 = wire::v1;

// Bounds on what a peer may ask for (its numbers arrive over the wire).
constexpr absl::Duration kMaxThreadTimeout = absl::Minutes(1);
constexpr absl::Duration kMaxSymbolBudget = absl::Minutes(2);

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kStackService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<StackService>(host);
  });
  return true;
}();

absl::Duration clamp(int64_t ms, absl::Duration max) {
  return std::clamp(absl::Milliseconds(ms), absl::ZeroDuration(), max);
}

}  // namespace

StackService::StackService(proc::ProcHost& host) : host_(host) {
  host.allow_observers(v1::StackDumpRequest().GetTypeName());  // read-only
  host.on_control(v1::StackDumpRequest().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    on_request(peer, correlation, payload);
                  });
}

StackService::~StackService() { detach(); }

void StackService::on_request(const ProcId& peer, uint64_t correlation, const std::string& payload) {
  Request r{peer, correlation, {}};
  if (!r.request.ParseFromString(payload)) {
    v1::StackDumpReply reply;
    wire::status_to_wire(absl::InvalidArgumentError("malformed StackDumpRequest"), &reply);
    (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
    return;
  }
  detail::MutexLock lock(mu_);
  if (stopping_) return;
  queue_.push_back(std::move(r));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  cv_.notify_one();
}

void StackService::run() {
  platform::set_current_thread_name("cm-stacks");
  for (;;) {
    Request r;
    {
      detail::MutexLock lock(mu_);
      cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    v1::StackDumpReply reply = dump_this_process(clamp(r.request.thread_timeout_ms(), kMaxThreadTimeout),
                                                 clamp(r.request.symbol_budget_ms(), kMaxSymbolBudget));
    // detach() joins this thread before the host goes, so host_ is valid here.
    (void)host_.send_control(r.peer, reply, r.correlation, /*is_reply=*/true);
  }
}

void StackService::detach() {
  std::thread thread;
  {
    detail::MutexLock lock(mu_);
    stopping_ = true;
    thread = std::move(thread_);
    cv_.notify_one();
  }
  if (thread.joinable()) thread.join();  // a dump in progress ends within its bounds
}

}  // namespace castmesh::debug
