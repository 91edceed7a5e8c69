// RankMailbox: the receive side of one rank of one communicator: MPI's
// matching of incoming messages against posted receives, per channel
// (point-to-point, collective steps), source and tag, in arrival order on
// both sides, so messages from one source with one tag never overtake.
//
// A message that finds a matching posted receive is copied straight into
// that receive's buffer (by the delivering thread: an I/O thread, or the
// sender itself when it lives in this process); otherwise it waits in the
// unexpected queue (its bytes kept in the transport's buffer, or copied
// once for a sender in this process, so sends complete eagerly).
//
// Failures: a dead source rank, an aborted collective, or the mailbox
// closing fail the matching receives, now and later.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "core/progress/request_state.h"
#include "core/transport/endpoint.h"
#include "core/wire/payload.h"

namespace castmesh::collectives {

enum class Channel : uint8_t { kP2P = 0, kCollective = 1 };

class RemoteBody;

// Everything that identifies an incoming message for matching.
struct MessageKey {
  Channel channel = Channel::kP2P;
  int source = 0;
  int64_t tag = 0;
  std::string signature;  // collectives: what the sender called
  // Set when the body is still in the sender's memory (single copy).
  std::shared_ptr<const RemoteBody> remote;
};

// What a rank called at one collective ("allreduce(sum, float32,
// count=256)"): made once per call and shared, read-only, by the call and
// its posted receives, so that posting a step copies no string.
using CallSignature = std::shared_ptr<const std::string>;
// The text of `signature` ("" for none: point-to-point).
inline std::string_view signature_text(const CallSignature& signature) {
  return signature != nullptr ? std::string_view(*signature) : std::string_view();
}

// One posted receive.
struct PostedRecv {
  Channel channel = Channel::kP2P;
  int source = kAnySource;  // kAnySource only on kP2P
  int64_t tag = kAnyTag;    // kAnyTag only on kP2P
  CallSignature signature;  // collectives: what this rank called
  void* buffer = nullptr;
  size_t capacity = 0;
  std::shared_ptr<detail::RequestState> request;
};

// The body of a message that stayed in the sender's memory
// (core/link/single_copy.h): it moves when a receive matches.
class RemoteBody {
 public:
  virtual ~RemoteBody() = default;
  virtual size_t size() const = 0;
  // Reads the body into `recv` and completes it (or fails it with `error`
  // when that is not OK), and tells the sender it may reuse its buffer.
  virtual void deliver(const PostedRecv& recv, const MessageKey& key, const absl::Status& error) const = 0;
};

class RankMailbox {
 public:
  // A message for this rank. `data[0, size)` is read before deliver returns
  // unless `payload` owns it (then it may be kept).
  void deliver(MessageKey key, const char* data, size_t size, wire::Payload payload = {});
  // deliver() of a message without a remote body whose key fields are views
  // (a compact ring record): nothing is copied or allocated unless the
  // message has to wait in the unexpected queue. `data` is read before this
  // returns. Any delivering thread.
  void deliver_view(Channel channel, int source, int64_t tag, std::string_view signature, const char* data,
                    size_t size);
  // A message of `size` bytes whose header arrived and whose body has not:
  // when a posted receive matches it now (it is taken, in arrival order as
  // deliver would), a sink that reads the body straight into that
  // receive's buffer and completes it; else nullptr (deliver comes later).
  // Only for bodies that travel in the frame (no single copy).
  std::shared_ptr<transport::PayloadSink> sink_for(const MessageKey& key, size_t size);
  // Posts a receive; it completes now when a queued message matches.
  void post(PostedRecv recv);
  // Removes a posted receive not yet matched (true) — e.g. a cancelled one.
  bool cancel(const std::shared_ptr<detail::RequestState>& request);
  // The oldest matching queued point-to-point message, waiting up to
  // `timeout` for one (kDeadlineExceeded), or nullopt-like error.
  absl::StatusOr<MessageStatus> probe(int source, int64_t tag, absl::Duration timeout);

  // Source rank `rank` is gone: its receives (and any-source receives) fail.
  void fail_source(int rank, const absl::Status& why);
  // Collective `sequence` failed: its receives fail, now and later.
  void abort_collective(uint64_t sequence, const absl::Status& why);
  // The error of collective `sequence` if it was aborted, or OK.
  absl::Status collective_error(uint64_t sequence);
  // The error of source rank `rank` if it is gone, or OK.
  absl::Status source_error(int rank);
  // Fails everything posted and everything posted later.
  void close(const absl::Status& why);

 private:
  struct Queued {
    MessageKey key;
    wire::Payload bytes;
  };
  static bool matches(const PostedRecv& recv, const MessageKey& key);
  static uint64_t sequence_of(const PostedRecv& recv);

 public:
  // Copies a matched message into `recv`'s buffer and completes it (a
  // remote body moves now). Call with no mailbox lock held.
  static void fill(const PostedRecv& recv, const MessageKey& key, const char* data, size_t size);

 private:
  absl::Status failure_for(const PostedRecv& recv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes and returns the oldest posted receive matching `key`, if any.
  std::optional<PostedRecv> take_posted(const MessageKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes and returns the oldest posted receive that `key` conflicts with
  // (a descriptor of the same collective with another signature), if any.
  std::optional<PostedRecv> take_conflicting(Channel channel, int64_t tag, std::string_view signature)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `record` (which notes a failure) under the lock, then fails every
  // posted receive that the failure now covers.
  void record_failure(const std::function<void()>& record);

  detail::Mutex mu_;
  // Set (under mu_, never cleared) once a source died or the mailbox closed:
  // until then source_error() needs no lock.
  std::atomic<bool> any_source_failure_{false};
  // Signalled when a message is queued or a failure recorded (probe waits).
  detail::CondVar changed_;
  std::deque<PostedRecv> posted_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> unexpected_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, absl::Status> dead_sources_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> aborted_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

// The tag step of a collective's descriptor: a message, sent besides the
// algorithm's own (device collectives send one to the next rank, see
// device_collectives.h), whose signature says what its sender called at that
// sequence. A descriptor that meets a message or receive of the same
// sequence with another signature, whatever its step or source, fails that
// receive as a mismatched collective. No algorithm uses this step.
inline constexpr uint32_t kDescriptorStep = 0xffffff;

// The tag of step `step` of collective `sequence`.
inline int64_t collective_tag(uint64_t sequence, uint32_t step) {
  return static_cast<int64_t>((sequence << 24) | (step & 0xffffff));
}

}  // namespace castmesh::collectives
