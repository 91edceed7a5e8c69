// SingleCopyLink: large messages to a process of this host without copying
// them through a frame. The sender sends an offer (a frame naming its pid,
// the buffer's address and size, and its host identity: a link::Region);
// the receiver, when a receive matches, reads the bytes straight into it
// (single_copy.h, process_vm_readv) and answers. The sender's request
// completes on that answer, so its buffer is read until then. When the
// receiver cannot read (another pid namespace, the kernel refuses), its
// answer asks for the bytes, which then go as a frame.
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

}  // namespace castmesh::link
