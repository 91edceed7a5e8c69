#include "core/collectives/comm_group.h"

#include <unistd.h>

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/exchange.h"
#include "core/collectives/handles.h"
#include "core/link/frame_link.h"
#include "core/trace/recorder.h"
#include "core/log/log.h"
#include "core/progress/progress_engine.h"

namespace castmesh::detail {

using collectives::Channel;
using collectives::Exchange;
namespace v1 = wire::v1;

std::shared_ptr<CommGroup> CommGroup::Get(Layout layout, bool pin) {
  const std::string id = layout.id;
  const int rank = layout.rank;
  std::shared_ptr<CommGroup> group =
      Exchange::instance().group(id, rank, pin, [&] { return std::make_shared<CommGroup>(std::move(layout)); });
  if (pin) group->pinned_.store(true, std::memory_order_relaxed);
  return group;
}

CommGroup::CommGroup(Layout layout)
    : layout_(std::move(layout)),
      strand_(std::make_shared<progress::Strand>(layout_.description)),
      links_(layout_.procs, layout_.self_proc, layout_.host, layout_.description, layout_.test_link),
      counters_(layout_.description, layout_.rank, static_cast<int>(layout_.procs.size())) {
  mailbox_ = Exchange::instance().mailbox(layout_.id, layout_.rank);
  Exchange::instance().watch(layout_.id, layout_.rank, layout_.procs, layout_.description);
}

CommGroup::~CommGroup() { Exchange::instance().forget(layout_.id, layout_.rank); }

absl::Status CommGroup::check_dest(int dest) const {
  if (dest < 0 || dest >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("destination rank ", dest, " is not in 0..", size() - 1));
  }
  return mailbox_->source_error(dest);
}

link::Envelope CommGroup::envelope(Channel channel, int dest, int64_t tag, std::string_view signature,
                                   uint64_t sequence) const {
  return link::Envelope{layout_.id, rank(), dest, channel == Channel::kCollective, tag, sequence, signature};
}

void CommGroup::log_step(const link::Envelope& e, size_t bytes) {
  // While a trace records: each step an instant named by its path, on the
  // thread that sends it (the call's slice encloses it).
  if (e.collective && trace::on()) {
    trace::record(trace::Record{trace::now_ns(), 0, 0, bytes,
                                trace::intern_cached(link::path_name(links_.path(e.dest, bytes))), 0,
                                trace::Category::kCollective, trace::RecordKind::kInstant});
  }
  if (!e.collective || !log::logger().should_log(spdlog::level::debug)) return;
  CASTMESH_LOG_DEBUG("castmesh-collectives: {} rank {}: collective {} step {} to rank {}, {} B: {}",
                     layout_.description, rank(), e.sequence, e.tag & 0xffffff, e.dest, bytes,
                     link::path_name(links_.path(e.dest, bytes)));
}

void CommGroup::count_path(const link::Link& link, const ProcId& proc, size_t bytes) {
  const link::Path path = link.path(proc);
  metrics::count_path(static_cast<unsigned>(path), link::path_name(path), /*outbound=*/true, bytes);
}

absl::Status CommGroup::send(Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                             const std::string& signature, uint64_t sequence) {
  if (absl::Status bad = check_dest(dest); !bad.ok()) return bad;
  const link::Envelope e = envelope(channel, dest, tag, signature, sequence);
  log_step(e, bytes);
  link::Link& link = *links_.route(dest, bytes).link;
  const ProcId& proc = layout_.procs[dest];
  count_path(link, proc, bytes);
  if (std::optional<absl::Status> sent = link.send_now(proc, e, data, bytes)) return *sent;
  return link.post_send(proc, e, data, bytes)->wait(absl::InfiniteDuration()).status();
}

std::shared_ptr<RequestState> CommGroup::start_send(Channel channel, int dest, int64_t tag, const void* data,
                                                    size_t bytes, const std::string& signature, uint64_t sequence) {
  if (absl::Status bad = check_dest(dest); !bad.ok()) return RequestState::Done(bad);
  const link::Envelope e = envelope(channel, dest, tag, signature, sequence);
  log_step(e, bytes);
  link::Link& link = *links_.route(dest, bytes).link;
  const ProcId& proc = layout_.procs[dest];
  count_path(link, proc, bytes);
  if (std::optional<absl::Status> sent = link.send_now(proc, e, data, bytes)) {
    if (!sent->ok()) return RequestState::Done(*std::move(sent));
    return RequestState::Done(MessageStatus{rank(), static_cast<int>(tag), bytes});
  }
  return link.post_send(proc, e, data, bytes);
}

std::shared_ptr<RequestState> CommGroup::post_recv(Channel channel, int source, int64_t tag, void* buffer,
                                                   size_t capacity, collectives::CallSignature signature) {
  auto request = std::make_shared<RequestState>();
  if (source != kAnySource && (source < 0 || source >= size())) {
    request->complete(absl::InvalidArgumentError(absl::StrCat("source rank ", source, " is not in 0..", size() - 1)));
    return request;
  }
  mailbox_->post(collectives::PostedRecv{channel, source, tag, std::move(signature), buffer, capacity, request});
  return request;
}

void CommGroup::abort(uint64_t sequence, const absl::Status& why) {
  if (!mailbox_->collective_error(sequence).ok()) return;  // already aborted here
  const absl::Status error(why.code(), absl::StrCat("rank ", rank(), ": ", why.message()));
  mailbox_->abort_collective(sequence, error);
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    // A lost peer needs no abort; the others fail their receives on it.
    (void)links_.route(r, 0).link->send_abort(layout_.procs[r], envelope(Channel::kCollective, r, 0, {}, sequence),
                                              error);
  }
}

Request CommGroup::run_async(std::function<absl::Status()> op) {
  auto request = std::make_shared<RequestState>();
  // The job holds the group: an operation that started finishes (or is
  // cancelled by on_last_handle_gone) even if every handle goes meanwhile.
  strand_->post(progress::Job{
      [self = shared_from_this(), op = std::move(op), request] {
        absl::Status st = op();
        if (st.ok()) {
          request->complete(MessageStatus{});
        } else {
          request->complete(st);
        }
      },
      [request](const absl::Status& why) { request->complete(why); }});
  return collectives_internal::Handles::request(request);
}

struct CommGroup::UserHandle {
  explicit UserHandle(std::shared_ptr<CommGroup> g) : group(std::move(g)) {}
  UserHandle(const UserHandle&) = delete;
  UserHandle& operator=(const UserHandle&) = delete;
  ~UserHandle() { group->on_last_handle_gone(); }
  const std::shared_ptr<CommGroup> group;
};

std::shared_ptr<CommGroup> CommGroup::user_handle(std::shared_ptr<CommGroup> group) {
  if (group == nullptr) return nullptr;
  CommGroup* raw = group.get();
  detail::MutexLock lock(raw->handle_mu_);
  std::shared_ptr<UserHandle> handle = raw->handle_.lock();
  if (handle == nullptr) {
    // `group` may itself be a handle of a generation that is going now: hold
    // the group's own reference, not the handle's.
    handle = std::make_shared<UserHandle>(raw->shared_from_this());
    raw->handle_ = handle;
  }
  return std::shared_ptr<CommGroup>(handle, raw);  // shares the handle's count
}

void CommGroup::on_last_handle_gone() {
  if (pinned_.load(std::memory_order_relaxed)) return;
  {
    detail::MutexLock lock(handle_mu_);
    if (handle_.lock() != nullptr) return;  // a new handle was made meanwhile
  }
  const absl::Status why = absl::CancelledError(
      absl::StrCat(layout_.description.empty() ? std::string("a communicator") : layout_.description, " (", layout_.id,
                   ") was destroyed (its last handle dropped) while this non-blocking operation was pending"));
  if (strand_->cancel_pending(why)) mailbox_->close(why);
}

}  // namespace castmesh::detail
