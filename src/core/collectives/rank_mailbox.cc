#include "core/collectives/rank_mailbox.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/link/body_sink.h"

namespace castmesh::collectives {

namespace {
bool matches_fields(const PostedRecv& recv, Channel channel, int source, int64_t tag) {
  if (recv.channel != channel) return false;
  if (recv.source != kAnySource && recv.source != source) return false;
  return recv.tag == kAnyTag || recv.tag == tag;
}
}  // namespace

bool RankMailbox::matches(const PostedRecv& recv, const MessageKey& key) {
  return matches_fields(recv, key.channel, key.source, key.tag);
}

uint64_t RankMailbox::sequence_of(const PostedRecv& recv) { return static_cast<uint64_t>(recv.tag) >> 24; }

namespace {
absl::Status mismatch(const PostedRecv& recv, int source, std::string_view signature) {
  const std::string_view mine = signature_text(recv.signature);
  return absl::FailedPreconditionError(absl::StrCat("mismatched collective: rank ", source, " called ",
                                                    absl::string_view(signature.data(), signature.size()),
                                                    ", this rank called ", absl::string_view(mine.data(), mine.size())));
}

// A descriptor (kDescriptorStep) and a message or receive of the same
// collective that disagree about what was called.
bool conflicts(const PostedRecv& recv, Channel channel, int64_t tag, std::string_view signature) {
  if (recv.channel != Channel::kCollective || channel != Channel::kCollective) return false;
  if ((recv.tag >> 24) != (tag >> 24)) return false;
  const bool descriptor = (recv.tag & 0xffffff) == kDescriptorStep || (tag & 0xffffff) == kDescriptorStep;
  return descriptor && signature_text(recv.signature) != signature;
}

absl::Status fill_error(const PostedRecv& recv, int source, int64_t tag, std::string_view signature, size_t size) {
  if (recv.channel == Channel::kCollective && signature_text(recv.signature) != signature) {
    return mismatch(recv, source, signature);
  }
  if (size > recv.capacity) {
    return absl::OutOfRangeError(absl::StrCat("a message of ", size, " bytes from rank ", source, " (tag ", tag,
                                              ") does not fit the receive buffer of ", recv.capacity, " bytes"));
  }
  return absl::OkStatus();
}
absl::Status fill_error(const PostedRecv& recv, const MessageKey& key, size_t size) {
  return fill_error(recv, key.source, key.tag, key.signature, size);
}
}  // namespace

void RankMailbox::fill(const PostedRecv& recv, const MessageKey& key, const char* data, size_t size) {
  if (key.remote != nullptr) size = key.remote->size();
  absl::Status error = fill_error(recv, key, size);
  if (key.remote != nullptr) return key.remote->deliver(recv, key, error);
  if (!error.ok()) {
    recv.request->complete(std::move(error));
    return;
  }
  if (size > 0) std::memcpy(recv.buffer, data, size);
  const int tag = key.channel == Channel::kP2P ? static_cast<int>(key.tag) : 0;
  recv.request->complete(MessageStatus{key.source, tag, size});
}

absl::Status RankMailbox::failure_for(const PostedRecv& recv) {
  if (!closed_.ok()) return closed_;
  if (recv.channel == Channel::kCollective) {
    if (auto it = aborted_.find(sequence_of(recv)); it != aborted_.end()) return it->second;
  }
  if (recv.source == kAnySource) {
    // MPI: an any-source receive cannot complete safely once a peer is gone.
    if (!dead_sources_.empty()) return dead_sources_.begin()->second;
    return absl::OkStatus();
  }
  auto it = dead_sources_.find(recv.source);
  return it == dead_sources_.end() ? absl::OkStatus() : it->second;
}

namespace {

// Reads a frame's body straight into the buffer of the receive it matched.
class PostedRecvSink final : public link::BodySink {
 public:
  PostedRecvSink(PostedRecv recv, MessageKey key, size_t size)
      : recv_(std::move(recv)), key_(std::move(key)), size_(size), error_(fill_error(recv_, key_, size)) {}

  std::optional<size_t> receive_wanted(size_t offset, size_t n, const Take& take) override {
    if (!error_.ok()) return std::nullopt;  // the receive fails: read past the body
    return take(static_cast<char*>(recv_.buffer) + offset, n);
  }

  void finish(bool complete) override {
    if (!complete) {
      recv_.request->complete(absl::UnavailableError(
          absl::StrCat("the connection to rank ", key_.source, " was lost while its message arrived")));
      return;
    }
    if (!error_.ok()) {
      recv_.request->complete(error_);
      return;
    }
    const int tag = key_.channel == Channel::kP2P ? static_cast<int>(key_.tag) : 0;
    recv_.request->complete(MessageStatus{key_.source, tag, size_});
  }

 private:
  const PostedRecv recv_;
  const MessageKey key_;
  const size_t size_;
  const absl::Status error_;
};

}  // namespace

std::optional<PostedRecv> RankMailbox::take_posted(const MessageKey& key) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (matches(*it, key)) {
      PostedRecv recv = std::move(*it);
      posted_.erase(it);
      return recv;
    }
  }
  return std::nullopt;
}

std::shared_ptr<transport::PayloadSink> RankMailbox::sink_for(const MessageKey& key, size_t size) {
  if (key.remote != nullptr) return nullptr;
  std::optional<PostedRecv> matched;
  {
    detail::MutexLock lock(mu_);
    matched = take_posted(key);
  }
  if (!matched) return nullptr;
  return std::make_shared<PostedRecvSink>(*std::move(matched), key, size);
}

void RankMailbox::deliver(MessageKey key, const char* data, size_t size, wire::Payload payload) {
  std::optional<PostedRecv> matched;
  std::optional<PostedRecv> conflicting;
  absl::Status conflict;
  {
    detail::MutexLock lock(mu_);
    matched = take_posted(key);
    if (!matched) {
      conflicting = take_conflicting(key.channel, key.tag, key.signature);
      if (conflicting) conflict = mismatch(*conflicting, key.source, key.signature);
      wire::Payload bytes;
      if (key.remote != nullptr) {
        // the body stays with the sender until a receive matches
      } else if (payload.empty() || payload.borrowed()) {  // borrowed: only during this call
        bytes = wire::Payload::copy_of(std::string_view(data, size));
      } else {
        auto owner = std::make_shared<wire::Payload>(std::move(payload));
        bytes = wire::Payload::share(owner, data, size);
      }
      unexpected_.push_back(Queued{std::move(key), std::move(bytes)});
      changed_.notify_all();
      if (!conflicting) return;
    }
  }
  if (conflicting) {
    conflicting->request->complete(std::move(conflict));
    return;
  }
  fill(*matched, key, data, size);
}

std::optional<PostedRecv> RankMailbox::take_conflicting(Channel channel, int64_t tag, std::string_view signature) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (conflicts(*it, channel, tag, signature)) {
      PostedRecv recv = std::move(*it);
      posted_.erase(it);
      return recv;
    }
  }
  return std::nullopt;
}

void RankMailbox::deliver_view(Channel channel, int source, int64_t tag, std::string_view signature,
                               const char* data, size_t size) {
  std::optional<PostedRecv> matched;
  std::optional<PostedRecv> conflicting;
  {
    detail::MutexLock lock(mu_);
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if (matches_fields(*it, channel, source, tag)) {
        matched = std::move(*it);
        posted_.erase(it);
        break;
      }
    }
    if (!matched) {
      conflicting = take_conflicting(channel, tag, signature);
      MessageKey key{channel, source, tag, std::string(signature), nullptr};
      unexpected_.push_back(Queued{std::move(key), wire::Payload::copy_of(std::string_view(data, size))});
      changed_.notify_all();
      if (!conflicting) return;
    }
  }
  if (conflicting) {
    conflicting->request->complete(mismatch(*conflicting, source, signature));
    return;
  }
  if (absl::Status error = fill_error(*matched, source, tag, signature, size); !error.ok()) {
    matched->request->complete(std::move(error));
    return;
  }
  if (size > 0) std::memcpy(matched->buffer, data, size);
  matched->request->complete(MessageStatus{source, channel == Channel::kP2P ? static_cast<int>(tag) : 0, size});
}

void RankMailbox::post(PostedRecv recv) {
  std::optional<Queued> queued;
  const MessageKey* conflict = nullptr;
  {
    detail::MutexLock lock(mu_);
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (matches(recv, it->key)) {
        queued = std::move(*it);
        unexpected_.erase(it);
        break;
      }
      if (conflict == nullptr && conflicts(recv, it->key.channel, it->key.tag, it->key.signature)) conflict = &it->key;
    }
    if (!queued) {
      absl::Status failed = failure_for(recv);
      if (failed.ok() && conflict != nullptr) failed = mismatch(recv, conflict->source, conflict->signature);
      if (!failed.ok()) {
        recv.request->complete(failed);
        return;
      }
      posted_.push_back(std::move(recv));
      return;
    }
  }
  fill(recv, queued->key, queued->bytes.data(), queued->bytes.size());
}

bool RankMailbox::cancel(const std::shared_ptr<detail::RequestState>& request) {
  detail::MutexLock lock(mu_);
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->request == request) {
      posted_.erase(it);
      return true;
    }
  }
  return false;
}

absl::StatusOr<MessageStatus> RankMailbox::probe(int source, int64_t tag, absl::Duration timeout) {
  PostedRecv pattern;
  pattern.source = source;
  pattern.tag = tag;
  std::optional<MessageStatus> found;
  absl::Status failed;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Queued& q : unexpected_) {
      if (matches(pattern, q.key)) {
        const size_t bytes = q.key.remote != nullptr ? q.key.remote->size() : q.bytes.size();
        found = MessageStatus{q.key.source, static_cast<int>(q.key.tag), bytes};
        return true;
      }
    }
    failed = failure_for(pattern);
    return !failed.ok();
  };
  detail::MutexLock lock(mu_);
  if (!changed_.wait_for(lock, timeout, ready)) {
    return absl::DeadlineExceededError(absl::StrCat("no matching message within ", absl::FormatDuration(timeout)));
  }
  if (found) return *found;
  return failed;
}

namespace {
// Removes and returns the posted receives for which `failed` says non-OK.
template <typename F>
std::vector<std::pair<PostedRecv, absl::Status>> take_failed(std::deque<PostedRecv>& posted, F failed) {
  std::vector<std::pair<PostedRecv, absl::Status>> out;
  for (auto it = posted.begin(); it != posted.end();) {
    absl::Status st = failed(*it);
    if (st.ok()) {
      ++it;
      continue;
    }
    out.emplace_back(std::move(*it), std::move(st));
    it = posted.erase(it);
  }
  return out;
}
}  // namespace

void RankMailbox::fail_source(int rank, const absl::Status& why) {
  record_failure([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    dead_sources_.emplace(rank, why);
    any_source_failure_.store(true, std::memory_order_release);
  });
}

void RankMailbox::abort_collective(uint64_t sequence, const absl::Status& why) {
  record_failure([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { aborted_.emplace(sequence, why); });
}

void RankMailbox::record_failure(const std::function<void()>& record) {
  std::vector<std::pair<PostedRecv, absl::Status>> failed;
  {
    detail::MutexLock lock(mu_);
    record();
    failed = take_failed(posted_, [this](const PostedRecv& r) ABSL_NO_THREAD_SAFETY_ANALYSIS { return failure_for(r); });
  }
  changed_.notify_all();
  for (auto& [recv, st] : failed) recv.request->complete(st);
}

absl::Status RankMailbox::collective_error(uint64_t sequence) {
  detail::MutexLock lock(mu_);
  if (!closed_.ok()) return closed_;
  auto it = aborted_.find(sequence);
  return it == aborted_.end() ? absl::OkStatus() : it->second;
}

absl::Status RankMailbox::source_error(int rank) {
  if (!any_source_failure_.load(std::memory_order_acquire)) return absl::OkStatus();
  detail::MutexLock lock(mu_);
  if (!closed_.ok()) return closed_;
  auto it = dead_sources_.find(rank);
  return it == dead_sources_.end() ? absl::OkStatus() : it->second;
}

void RankMailbox::close(const absl::Status& why) {
  record_failure([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_.ok()) closed_ = why;
    any_source_failure_.store(true, std::memory_order_release);
  });
}

}  // namespace castmesh::collectives
