#include "core/collectives/comm_group.h"

#include <unistd.h>

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/exchange.h"
#include "core/collectives/shm_path.h"
#include "core/collectives/single_copy.h"
#include "core/collectives/thread_cache.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
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
    : layout_(std::move(layout)), strand_(std::make_shared<progress::Strand>(layout_.description)) {
  mailbox_ = Exchange::instance().mailbox(layout_.id, layout_.rank);
  Exchange::instance().watch(layout_.id, layout_.rank, layout_.procs, layout_.description);
}

CommGroup::~CommGroup() { Exchange::instance().forget(layout_.id, layout_.rank); }

namespace {
std::atomic<uint64_t> next_token{1};  // process-wide: (proc, token) names a single-copy send
}  // namespace

absl::Status CommGroup::send(Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                             const std::string& signature, uint64_t sequence) {
  if (auto st = send_at_once(channel, dest, tag, data, bytes, signature, sequence)) return *st;
  return start_send_frame(channel, dest, tag, data, bytes, signature, sequence)
      ->wait(absl::InfiniteDuration())
      .status();
}

std::shared_ptr<RequestState> CommGroup::start_send(Channel channel, int dest, int64_t tag, const void* data,
                                                    size_t bytes, const std::string& signature, uint64_t sequence) {
  if (auto st = send_at_once(channel, dest, tag, data, bytes, signature, sequence)) {
    if (!st->ok()) return RequestState::Done(*std::move(st));
    return RequestState::Done(MessageStatus{rank(), static_cast<int>(tag), bytes});
  }
  return start_send_frame(channel, dest, tag, data, bytes, signature, sequence);
}

std::optional<absl::Status> CommGroup::send_at_once(Channel channel, int dest, int64_t tag, const void* data,
                                                    size_t bytes, const std::string& signature, uint64_t sequence) {
  if (dest < 0 || dest >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("destination rank ", dest, " is not in 0..", size() - 1));
  }
  if (absl::Status dead = mailbox_->source_error(dest); !dead.ok()) return dead;
  const ProcId& proc = layout_.procs[dest];
  if (proc == layout_.self_proc) {
    collectives::MessageKey key{channel, rank(), tag, signature, nullptr};
    Exchange::instance().mailbox(layout_.id, dest)->deliver(std::move(key), static_cast<const char*>(data), bytes);
    return absl::OkStatus();
  }
  if (bytes >= collectives::kSingleCopyMinBytes) return std::nullopt;
  const collectives::CompactMessage message{layout_.id,
                                            static_cast<uint32_t>(rank()),
                                            static_cast<uint32_t>(dest),
                                            channel == Channel::kCollective,
                                            tag,
                                            sequence,
                                            signature};
  std::optional<absl::Status> sent =
      collectives::try_send_compact(proc, message, std::string_view(static_cast<const char*>(data), bytes));
  if (sent && !sent->ok()) {
    return absl::Status(sent->code(), absl::StrCat("sending to rank ", dest, " (proc ", proc, "): ", sent->message()));
  }
  return sent;
}

std::shared_ptr<RequestState> CommGroup::start_send_frame(Channel channel, int dest, int64_t tag, const void* data,
                                                          size_t bytes, const std::string& signature,
                                                          uint64_t sequence) {
  const MessageStatus sent{rank(), static_cast<int>(tag), bytes};
  const ProcId& proc = layout_.procs[dest];
  if (bytes >= collectives::kSingleCopyMinBytes && collectives::single_copy_towards(proc)) {
    return start_single_copy(PendingSend{dest, channel, tag, signature, sequence, data, bytes, nullptr, nullptr});
  }
  collectives::ThreadLoan<v1::CollectiveHeader> header;  // no allocation per frame
  fill_frame_header(*header, channel, dest, tag, signature, sequence);
  if (bytes >= collectives::kSingleCopyMinBytes) {
    // Written to the socket from `data` itself: the request completes when
    // the transport lets go of the body (written, or the connection lost:
    // then the receiver fails on its own). A ring copies it at once.
    auto request = std::make_shared<RequestState>();
    std::shared_ptr<const void> owner(nullptr, [request, sent](const void*) { request->complete(sent); });
    if (absl::Status st = send_frame(dest, *header, data, bytes, std::move(owner)); !st.ok()) request->complete(st);
    return request;
  }
  absl::Status st = send_frame(dest, *header, data, bytes);
  return RequestState::Done(st.ok() ? absl::StatusOr<MessageStatus>(sent) : absl::StatusOr<MessageStatus>(st));
}

std::shared_ptr<RequestState> CommGroup::start_single_copy(PendingSend send) {
  const uint64_t token = next_token.fetch_add(1, std::memory_order_relaxed);
  auto request = std::make_shared<RequestState>();
  send.request = request;
  v1::CollectiveHeader header;
  fill_frame_header(header, send.channel, send.dest, send.tag, send.signature, send.sequence);
  header.set_token(token);
  header.set_body_pid(::getpid());
  header.set_body_address(reinterpret_cast<uint64_t>(send.data));
  header.set_body_size(send.bytes);
  header.set_host_identity(platform::host_identity());
  const int dest = send.dest;
  {
    detail::MutexLock lock(sends_mu_);
    pending_sends_.emplace(token, std::move(send));
  }
  if (absl::Status st = send_frame(dest, header, nullptr, 0); !st.ok()) {
    {
      detail::MutexLock lock(sends_mu_);
      pending_sends_.erase(token);
    }
    request->complete(st);
  }
  return request;
}

void CommGroup::on_send_done(uint64_t token, bool fallback) {
  std::optional<PendingSend> send;
  {
    detail::MutexLock lock(sends_mu_);
    auto it = pending_sends_.find(token);
    if (it == pending_sends_.end()) return;
    send = std::move(it->second);
    pending_sends_.erase(it);
  }
  absl::Status st;
  if (fallback) {  // the receiver could not read our memory: send the bytes
    v1::CollectiveHeader header;
    fill_frame_header(header, send->channel, send->dest, send->tag, send->signature, send->sequence);
    header.set_token(token);
    header.set_fallback_body(true);
    st = send_frame(send->dest, header, send->data, send->bytes);
  }
  if (st.ok()) {
    send->request->complete(MessageStatus{rank(), static_cast<int>(send->tag), send->bytes});
  } else {
    send->request->complete(st);
  }
}

void CommGroup::abandon_send(const std::shared_ptr<RequestState>& request) {
  if (request->done()) return;
  bool copied = false;
  {
    detail::MutexLock lock(sends_mu_);
    for (auto& [token, send] : pending_sends_) {
      if (send.request != request) continue;
      // Kept until the receiver answers or its proc is lost: a receiver whose
      // read failed would otherwise wait for the bytes for ever.
      send.abandoned = std::make_shared<const std::string>(static_cast<const char*>(send.data), send.bytes);
      send.data = send.abandoned->data();
      copied = true;
      break;
    }
  }
  if (copied) {
    request->complete(absl::AbortedError("a single-copy send abandoned by its failed collective"));
    return;
  }
  // on_send_done took it and completes it once it no longer reads the buffer.
  (void)request->wait(absl::InfiniteDuration());
}

void CommGroup::fail_sends_to(const ProcId& proc, const absl::Status& why) {
  std::vector<std::pair<int, std::shared_ptr<RequestState>>> failed;
  {
    detail::MutexLock lock(sends_mu_);
    for (auto it = pending_sends_.begin(); it != pending_sends_.end();) {
      if (layout_.procs[it->second.dest] != proc) {
        ++it;
        continue;
      }
      failed.emplace_back(it->second.dest, it->second.request);
      pending_sends_.erase(it++);
    }
  }
  // Named like a failed receive, so a collective that fails on a send says
  // which rank is gone too.
  for (auto& [dest, request] : failed) {
    request->complete(absl::Status(
        why.code(), absl::StrCat("rank ", dest, " of the ", layout_.description, " is gone: ", why.message())));
  }
}

void CommGroup::fill_frame_header(v1::CollectiveHeader& header, Channel channel, int dest, int64_t tag,
                                  std::string_view signature, uint64_t sequence) const {
  header.Clear();  // keeps the memory of its string fields
  header.mutable_comm()->assign(layout_.id);
  header.set_source(static_cast<uint32_t>(rank()));
  header.set_dest(static_cast<uint32_t>(dest));
  header.set_channel(channel == Channel::kCollective ? v1::CollectiveHeader::CHANNEL_COLLECTIVE
                                                     : v1::CollectiveHeader::CHANNEL_P2P);
  header.set_tag(tag);
  header.set_sequence(sequence);
  header.mutable_signature()->assign(signature.data(), signature.size());
}

absl::Status CommGroup::send_frame(int dest, const v1::CollectiveHeader& header, const void* body, size_t bytes,
                                   std::shared_ptr<const void> body_owner) {
  std::shared_ptr<proc::ProcHost> host = layout_.host.lock();
  if (host == nullptr) return absl::UnavailableError("this proc's transport is shut down");
  const ProcId& proc = layout_.procs[dest];
  collectives::ThreadLoan<std::string> encoded;
  header.SerializeToString(&*encoded);
  absl::Status sent = collectives::send_collective_frame(
      *host, proc, *encoded, std::string_view(static_cast<const char*>(body), bytes), std::move(body_owner));
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("sending to rank ", dest, " (proc ", proc, "): ", sent.message()));
  }
  return absl::OkStatus();
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
    if (layout_.procs[r] == layout_.self_proc) {
      Exchange::instance().mailbox(layout_.id, r)->abort_collective(sequence, error);
      continue;
    }
    v1::CollectiveHeader header;
    fill_frame_header(header, Channel::kCollective, r, 0, std::string(error.message()), sequence);
    header.set_channel(v1::CollectiveHeader::CHANNEL_ABORT);
    (void)send_frame(r, header, nullptr, 0);
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
  return Request(request);
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
