#include "core/output/output_printer.h"

#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace castmesh::output {

OutputPrinter::OutputPrinter() : thread_([this] { loop(); }) {}

OutputPrinter::~OutputPrinter() {
  {
    detail::MutexLock lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

void OutputPrinter::add(const std::string& label, int stream, std::vector<std::string> lines, uint64_t dropped,
                        absl::Duration window) {
  detail::MutexLock lock(mu_);
  if (dropped > 0) {
    queue_.push_back(Entry{label, 2,
                           absl::StrCat("... ", dropped, " line(s) of this proc's output dropped (its unsent backlog "
                                        "was over its bound: the controller did not keep up)"),
                           absl::ZeroDuration()});
    ++queued_;
  }
  for (std::string& text : lines) {
    queue_.push_back(Entry{label, stream, std::move(text), window});
    ++queued_;
  }
  cv_.notify_all();
}

void OutputPrinter::flush() {
  detail::MutexLock lock(mu_);
  const uint64_t target = queued_;
  cv_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return written_ >= target && aggregates_.empty(); });
}

void OutputPrinter::write_line(int stream, const std::string& prefix, const std::string& text) {
  std::string line = absl::StrCat("[", prefix, "] ", text, "\n");
  const int fd = stream == 2 ? 2 : 1;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // a closed terminal: nothing to report it to
    }
  }
}

void OutputPrinter::flush_aggregates() {
  for (const auto& [key, aggregate] : aggregates_) {
    write_line(key.first,
               aggregate.count == 1 ? aggregate.first_label
                                    : absl::StrCat(aggregate.first_label, " and ", aggregate.count - 1, " more"),
               key.second);
  }
  aggregates_.clear();
  aggregate_index_.clear();
  window_end_ = absl::InfiniteFuture();
}

void OutputPrinter::loop() {
  detail::MutexLock lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (!aggregates_.empty() && absl::Now() >= window_end_) flush_aggregates();
      cv_.notify_all();  // flush() waiters
      if (stopping_) {
        flush_aggregates();
        return;
      }
      if (aggregates_.empty()) {
        cv_.wait(lock);
      } else {
        cv_.wait_for(lock, window_end_ - absl::Now());
      }
      continue;
    }
    std::vector<Entry> batch;
    batch.swap(queue_);
    for (Entry& e : batch) {
      if (e.window > absl::ZeroDuration()) {
        const std::string key = absl::StrCat(e.stream, ":", e.text);
        auto [it, inserted] = aggregate_index_.try_emplace(key, aggregates_.size());
        if (inserted) {
          aggregates_.push_back({{e.stream, std::move(e.text)}, Aggregate{std::move(e.label), 0}});
          if (window_end_ == absl::InfiniteFuture()) window_end_ = absl::Now() + e.window;
        }
        ++aggregates_[it->second].second.count;
      } else {
        // Written without the lock: a slow terminal must not hold up add().
        lock.unlock();
        write_line(e.stream, e.label, e.text);
        lock.lock();
      }
      ++written_;
    }
  }
}

}  // namespace castmesh::output
