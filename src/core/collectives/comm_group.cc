#include "core/collectives/comm_group.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/exchange.h"
#include "core/proc/proc_host.h"

namespace castmesh::detail {

using collectives::Channel;
using collectives::Exchange;
namespace v1 = wire::v1;

std::shared_ptr<CommGroup> CommGroup::Get(Layout layout, bool pin) {
  const std::string id = layout.id;
  const int rank = layout.rank;
  return Exchange::instance().group(id, rank, pin, [&] { return std::make_shared<CommGroup>(std::move(layout)); });
}

CommGroup::CommGroup(Layout layout) : layout_(std::move(layout)) {
  mailbox_ = Exchange::instance().mailbox(layout_.id, layout_.rank);
  Exchange::instance().watch(layout_.id, layout_.rank, layout_.procs, layout_.description);
}

CommGroup::~CommGroup() { Exchange::instance().forget(layout_.id, layout_.rank); }

absl::Status CommGroup::send(Channel channel, int dest, int64_t tag, const void* data, size_t bytes,
                             const std::string& signature, uint64_t sequence) {
  if (dest < 0 || dest >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("destination rank ", dest, " is not in 0..", size() - 1));
  }
  if (absl::Status dead = mailbox_->source_error(dest); !dead.ok()) return dead;
  const ProcId& proc = layout_.procs[dest];
  if (proc == layout_.self_proc) {
    collectives::MessageKey key{channel, rank(), tag, signature};
    Exchange::instance().mailbox(layout_.id, dest)->deliver(std::move(key), static_cast<const char*>(data), bytes);
    return absl::OkStatus();
  }
  std::shared_ptr<proc::ProcHost> host = layout_.host.lock();
  if (host == nullptr) return absl::UnavailableError("this proc's transport is shut down");
  v1::CollectiveHeader header;
  header.set_comm(layout_.id);
  header.set_source(static_cast<uint32_t>(rank()));
  header.set_dest(static_cast<uint32_t>(dest));
  header.set_channel(channel == Channel::kCollective ? v1::CollectiveHeader::CHANNEL_COLLECTIVE
                                                     : v1::CollectiveHeader::CHANNEL_P2P);
  header.set_tag(tag);
  header.set_sequence(sequence);
  header.set_signature(signature);
  absl::Status sent = host->send_data(proc, collectives::kCollectiveDataType, collectives::encode_frame(header, data, bytes));
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("sending to rank ", dest, " (proc ", proc, "): ", sent.message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<RequestState> CommGroup::post_recv(Channel channel, int source, int64_t tag, void* buffer,
                                                   size_t capacity, std::string signature) {
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
  std::shared_ptr<proc::ProcHost> host = layout_.host.lock();
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    if (layout_.procs[r] == layout_.self_proc) {
      Exchange::instance().mailbox(layout_.id, r)->abort_collective(sequence, error);
      continue;
    }
    if (host == nullptr) continue;
    v1::CollectiveHeader header;
    header.set_comm(layout_.id);
    header.set_source(static_cast<uint32_t>(rank()));
    header.set_dest(static_cast<uint32_t>(r));
    header.set_channel(v1::CollectiveHeader::CHANNEL_ABORT);
    header.set_sequence(sequence);
    header.set_signature(std::string(error.message()));
    (void)host->send_data(layout_.procs[r], collectives::kCollectiveDataType, collectives::encode_frame(header, nullptr, 0));
  }
}

Request CommGroup::run_async(std::function<absl::Status()> op) {
  auto request = std::make_shared<RequestState>();
  // The thread holds the group: the operation finishes even if every
  // handle is dropped meanwhile.
  std::thread([self = shared_from_this(), op = std::move(op), request] {
    absl::Status st = op();
    if (st.ok()) {
      request->complete(MessageStatus{});
    } else {
      request->complete(st);
    }
  }).detach();
  return Request(request);
}

}  // namespace castmesh::detail
