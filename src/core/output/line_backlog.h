// The lines a proc wrote that are not sent yet: a FIFO bounded in bytes that
// drops its oldest lines rather than block the writer, and counts them so
// the reader can say so. Thread-safe: one or more writers (the capture
// thread), one reader (the sender).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::output {

// One line without its newline, and the stream it was written to (1 or 2).
struct Line {
  int stream = 1;
  std::string text;
};

class LineBacklog {
 public:
  explicit LineBacklog(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Queues a line; drops the oldest ones while more than max_bytes are
  // queued (a line longer than the bound is kept alone). Never blocks.
  void push(int stream, std::string text);
  // Waits up to `timeout` for a line (or close()), then moves queued lines,
  // at least one and about `max_bytes` at most, into `out`. Returns the
  // number of lines dropped since the last take (before those taken).
  uint64_t take(std::vector<Line>* out, size_t max_bytes, absl::Duration timeout);
  // Wakes a waiting take(); later pushes are still queued.
  void close();
  bool empty() const;

 private:
  const size_t max_bytes_;
  mutable detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<Line> lines_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace castmesh::output
