// SingleCopyLink: large messages to a process of this host without copying
// them through a frame. The sender sends an offer (a frame naming its pid,
// the buffer's address and size, and its host identity: a link::Region);
// the receiver, when a receive matches, reads the bytes straight into it
// (single_copy.h, process_vm_readv) and answers. The sender's request
// completes on that answer, so its buffer is read until then. When the
// receiver cannot read (another pid namespace, the kernel refuses), its
// answer asks for the bytes, which then go as a frame.
//
// SingleCopyOffer is the receiving side of one offer: the read and the answer.
//
// Also one-sided: read()/write() copy into a peer's registered Region with
// process_vm_readv/writev.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/detail/mutex.h"
#include "core/link/frame_link.h"
#include "core/link/link.h"

namespace castmesh::link {

// One per communicator rank: its offers wait here for their answers.
// `frames` sends the offers (and fallback bodies) and outlives this;
// `description` names the communicator in errors. Thread-safe.
class SingleCopyLink final : public Link {
 public:
  SingleCopyLink(FrameLink& frames, std::string description) : frames_(frames), description_(std::move(description)) {}
  Path path(const ProcId&) const override { return Path::kSingleCopy; }
  Capabilities capabilities() const override;
  // Sends the offer; the request completes when the receiver has read it.
  std::shared_ptr<detail::RequestState> post_send(const ProcId& peer, const Envelope& envelope, const void* data,
                                                  size_t bytes) override;
  // Copies the bytes now, so a late answer asking for them (the receiver's
  // read failed) is served from the copy; when an answer is being handled
  // now, waits for it. Afterwards the buffer is read no more.
  void abandon_send(const std::shared_ptr<detail::RequestState>& request) override;
  // As a frame (an abort carries no body).
  absl::Status send_abort(const ProcId& peer, const Envelope& envelope, const absl::Status& why) override {
    return frames_.send_abort(peer, envelope, why);
  }
  // Offers to `peer` fail with `why`, naming the rank.
  void peer_lost(const ProcId& peer, const absl::Status& why) override;
  absl::Status read(const Region& remote, uint64_t offset, void* out, size_t bytes) override;
  absl::Status write(const Region& remote, uint64_t offset, const void* in, size_t bytes) override;

  // The receiver of offer `token` has read it, or (`fallback`) could not:
  // then the body goes out as a frame now. The I/O or ring thread that
  // delivered the answer.
  void on_answer(uint64_t token, bool fallback);

 private:
  // An offer waiting for its receiver.
  struct Pending {
    ProcId peer;
    std::string comm;
    std::string signature;
    Envelope envelope;  // comm and signature point at the strings above
    const void* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<detail::RequestState> request;
    std::shared_ptr<const std::string> abandoned;  // the bytes, once abandon_send copied them
  };

  FrameLink& frames_;
  const std::string description_;
  detail::Mutex mu_;
  // Node map: Pending's envelope points into its own strings.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
};

// The receiving side of one single-copy offer (a frame with a token from
// proc `peer`): reads the sender's buffer straight into a receive and
// answers the sender. Made by the matching layer from the offer's header on
// the thread that delivered it; read_into/answer from any thread, once each.
class SingleCopyOffer {
 public:
  SingleCopyOffer(std::weak_ptr<proc::ProcHost> host, ProcId peer, const wire::v1::CollectiveHeader& header);
  // The body's size.
  size_t size() const { return size_; }
  // The sending rank, the proc and the token that name the offer.
  uint32_t sender() const { return sender_; }
  const ProcId& peer() const { return peer_; }
  uint64_t token() const { return token_; }
  // Reads the body into `buffer` (at least size() bytes). kUnavailable: the
  // sender is gone; any other error: this process may not read it (another
  // pid namespace, an offer naming another process, the kernel refused), so
  // the bytes must come as a frame (answer(true)).
  absl::Status read_into(void* buffer) const;
  // Tells the sender its buffer is free, or (`fallback`) to send the bytes
  // as a frame instead.
  void answer(bool fallback) const;

 private:
  // Whether the offer's pid is the connection's peer (see the .cc).
  bool pid_is_the_peers() const;

  std::weak_ptr<proc::ProcHost> host_;
  ProcId peer_;
  std::string comm_;
  uint32_t sender_, receiver_;
  uint64_t token_;
  int64_t pid_;
  uint64_t address_;
  size_t size_;
  bool same_pids_;
};

}  // namespace castmesh::link
