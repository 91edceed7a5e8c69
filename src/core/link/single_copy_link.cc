#include "core/link/single_copy_link.h"

#include <unistd.h>

#include <atomic>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/link/shm_ring_path.h"
#include "core/link/single_copy.h"
#include "core/log/log.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"

namespace castmesh::link {
namespace {

namespace v1 = wire::v1;

std::atomic<uint64_t> next_token{1};  // process-wide: (proc, token) names an offer

// Whether `remote` is on this host and [offset, offset + bytes) inside it.
absl::Status check_region(const Region& remote, uint64_t offset, size_t bytes) {
  if (remote.host_identity != platform::host_identity()) {
    return absl::FailedPreconditionError("the region belongs to a process of another host (or pid namespace)");
  }
  if (!remote.contains(offset, bytes)) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + bytes, ") are outside the ",
                                              remote.bytes, "-byte region"));
  }
  return absl::OkStatus();
}

}  // namespace

Capabilities SingleCopyLink::capabilities() const {
  Capabilities caps;
  caps.one_sided = true;
  caps.zero_copy = true;
  caps.send_holds_buffer = true;
  caps.send_waits_for_receive = true;
  return caps;
}

std::shared_ptr<detail::RequestState> SingleCopyLink::post_send(const ProcId& peer, const Envelope& envelope,
                                                                const void* data, size_t bytes) {
  const uint64_t token = next_token.fetch_add(1, std::memory_order_relaxed);
  auto request = std::make_shared<detail::RequestState>();
  v1::CollectiveHeader header;
  FrameLink::fill_header(header, envelope);
  header.set_token(token);
  header.set_body_pid(::getpid());
  header.set_body_address(reinterpret_cast<uint64_t>(data));
  header.set_body_size(bytes);
  header.set_host_identity(platform::host_identity());
  auto pending = std::make_unique<Pending>();
  pending->peer = peer;
  pending->comm.assign(envelope.comm);
  pending->signature.assign(envelope.signature);
  pending->envelope = envelope;
  pending->envelope.comm = pending->comm;
  pending->envelope.signature = pending->signature;
  pending->data = data;
  pending->bytes = bytes;
  pending->request = request;
  {
    detail::MutexLock lock(mu_);
    pending_.emplace(token, std::move(pending));
  }
  if (absl::Status st = frames_.send_frame(peer, envelope.dest, header, nullptr, 0); !st.ok()) {
    {
      detail::MutexLock lock(mu_);
      pending_.erase(token);
    }
    request->complete(st);
  }
  return request;
}

void SingleCopyLink::on_answer(uint64_t token, bool fallback) {
  std::unique_ptr<Pending> send;
  {
    detail::MutexLock lock(mu_);
    auto it = pending_.find(token);
    if (it == pending_.end()) return;
    send = std::move(it->second);
    pending_.erase(it);
  }
  absl::Status st;
  if (fallback) {  // the receiver could not read our memory: send the bytes
    v1::CollectiveHeader header;
    FrameLink::fill_header(header, send->envelope);
    header.set_token(token);
    header.set_fallback_body(true);
    st = frames_.send_frame(send->peer, send->envelope.dest, header, send->data, send->bytes);
  }
  if (st.ok()) {
    send->request->complete(
        MessageStatus{send->envelope.source, static_cast<int>(send->envelope.tag), send->bytes});
  } else {
    send->request->complete(st);
  }
}

void SingleCopyLink::abandon_send(const std::shared_ptr<detail::RequestState>& request) {
  if (request->done()) return;
  bool copied = false;
  {
    detail::MutexLock lock(mu_);
    for (auto& [token, send] : pending_) {
      if (send->request != request) continue;
      // Kept until the receiver answers or its proc is lost: a receiver whose
      // read failed would otherwise wait for the bytes for ever.
      send->abandoned = std::make_shared<const std::string>(static_cast<const char*>(send->data), send->bytes);
      send->data = send->abandoned->data();
      copied = true;
      break;
    }
  }
  if (copied) {
    request->complete(absl::AbortedError("a single-copy send abandoned by its failed collective"));
    return;
  }
  // on_answer took it and completes it once it no longer reads the buffer.
  (void)request->wait(absl::InfiniteDuration());
}

void SingleCopyLink::peer_lost(const ProcId& peer, const absl::Status& why) {
  std::vector<std::pair<int, std::shared_ptr<detail::RequestState>>> failed;
  {
    detail::MutexLock lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->peer != peer) {
        ++it;
        continue;
      }
      failed.emplace_back(it->second->envelope.dest, it->second->request);
      pending_.erase(it++);
    }
  }
  // Named like a failed receive, so a collective that fails on a send says
  // which rank is gone too.
  for (auto& [dest, request] : failed) {
    request->complete(absl::Status(
        why.code(), absl::StrCat("rank ", dest, " of the ", description_, " is gone: ", why.message())));
  }
}

absl::Status SingleCopyLink::read(const Region& remote, uint64_t offset, void* out, size_t bytes) {
  if (absl::Status st = check_region(remote, offset, bytes); !st.ok()) return st;
  absl::Status copied = copy_between(remote.pid, remote.address + offset, static_cast<char*>(out), bytes, false);
  if (absl::IsPermissionDenied(copied) || absl::IsUnimplemented(copied)) note_single_copy_refused(copied);
  return copied;
}

absl::Status SingleCopyLink::write(const Region& remote, uint64_t offset, const void* in, size_t bytes) {
  if (absl::Status st = check_region(remote, offset, bytes); !st.ok()) return st;
  // process_vm_writev only reads the local side.
  absl::Status copied = copy_between(remote.pid, remote.address + offset,
                                     const_cast<char*>(static_cast<const char*>(in)), bytes, true);
  if (absl::IsPermissionDenied(copied) || absl::IsUnimplemented(copied)) note_single_copy_refused(copied);
  return copied;
}

SingleCopyOffer::SingleCopyOffer(std::weak_ptr<proc::ProcHost> host, ProcId peer, const v1::CollectiveHeader& header)
    : host_(std::move(host)),
      peer_(std::move(peer)),
      comm_(header.comm()),
      sender_(header.source()),
      receiver_(header.dest()),
      token_(header.token()),
      pid_(header.body_pid()),
      address_(header.body_address()),
      size_(header.body_size()),
      same_pids_(header.host_identity() == platform::host_identity()) {}

absl::Status SingleCopyOffer::read_into(void* buffer) const {
  if (!same_pids_) return absl::FailedPreconditionError("another pid namespace");
  if (!pid_is_the_peers()) return absl::PermissionDeniedError("the offer names another process");
  return read_process_memory(pid_, address_, buffer, size_);
}

// The offer's pid is the sending process itself where the kernel tells
// the connection's peer (Unix sockets): a peer cannot point this process
// at another process's memory. Over TCP the authenticated peer is trusted.
bool SingleCopyOffer::pid_is_the_peers() const {
  std::shared_ptr<proc::ProcHost> host = host_.lock();
  if (host == nullptr) return false;
  std::optional<long> peer_pid = host->peer_pid(peer_);
  if (!peer_pid || *peer_pid == pid_) return true;
  CASTMESH_LOG_WARN("castmesh-collectives: {} offered a single copy from pid {}, but its connection is pid {}; "
                    "asking for the bytes over the transport instead",
                    peer_, pid_, *peer_pid);
  return false;
}

void SingleCopyOffer::answer(bool fallback) const {
  std::shared_ptr<proc::ProcHost> host = host_.lock();
  if (host == nullptr) return;
  v1::CollectiveHeader done;
  done.set_comm(comm_);
  done.set_source(receiver_);
  done.set_dest(sender_);
  done.set_channel(v1::CollectiveHeader::CHANNEL_DONE);
  done.set_token(token_);
  done.set_fallback(fallback);
  (void)send_collective_frame(*host, peer_, done.SerializeAsString(), {});
}

}  // namespace castmesh::link
