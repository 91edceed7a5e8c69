#include "core/output/line_backlog.h"

#include <utility>

namespace castmesh::output {

void LineBacklog::push(int stream, std::string text) {
  detail::MutexLock lock(mu_);
  bytes_ += text.size() + 1;
  lines_.push_back(Line{stream, std::move(text)});
  while (bytes_ > max_bytes_ && lines_.size() > 1) {
    bytes_ -= lines_.front().text.size() + 1;
    lines_.pop_front();
    ++dropped_;
  }
  cv_.notify_one();
}

uint64_t LineBacklog::take(std::vector<Line>* out, size_t max_bytes, absl::Duration timeout) {
  detail::MutexLock lock(mu_);
  cv_.wait_for(lock, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !lines_.empty() || closed_; });
  size_t taken = 0;
  while (!lines_.empty() && (taken == 0 || taken + lines_.front().text.size() < max_bytes)) {
    taken += lines_.front().text.size() + 1;
    bytes_ -= lines_.front().text.size() + 1;
    out->push_back(std::move(lines_.front()));
    lines_.pop_front();
  }
  const uint64_t dropped = dropped_;
  dropped_ = 0;
  return dropped;
}

void LineBacklog::close() {
  detail::MutexLock lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

bool LineBacklog::empty() const {
  detail::MutexLock lock(mu_);
  return lines_.empty() && dropped_ == 0;
}

}  // namespace castmesh::output
