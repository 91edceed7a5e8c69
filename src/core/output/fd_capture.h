// Capturing a proc's own stdout and stderr at the file descriptors (so C,
// C++ and Python writes, and children that inherit them, are all caught):
// fds 1 and 2 become pipes read by a thread of this class, which splits
// what arrives into lines for a LineBacklog. Worker procs only (it takes
// over the process's fds 1 and 2). Start/stop from one thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/output/line_backlog.h"

namespace castmesh::output {

class FdCapture {
 public:
  // Redirects fds 1 and 2; errors (Unavailable, with the reason) leave them as they were.
  static absl::StatusOr<std::unique_ptr<FdCapture>> Start(std::shared_ptr<LineBacklog> backlog);
  // Puts fds 1 and 2 back, queues what was written before (a partial last
  // line too) and stops the thread.
  ~FdCapture();
  FdCapture(const FdCapture&) = delete;
  FdCapture& operator=(const FdCapture&) = delete;

  // Where stream 1 or 2 went before the capture (to write lines through).
  int original_fd(int stream) const { return stream == 1 ? original_[0] : original_[1]; }

 private:
  explicit FdCapture(std::shared_ptr<LineBacklog> backlog) : backlog_(std::move(backlog)) {}
  void read_loop();
  // Reads what `pipe` holds now into `partial`, queues the complete lines.
  // False at end of file or on an error.
  bool drain(int index);
  void flush_partial(int index);

  std::shared_ptr<LineBacklog> backlog_;
  int original_[2] = {-1, -1};  // dup of fds 1 and 2 as they were
  int read_end_[2] = {-1, -1};  // the pipes' read ends (non-blocking)
  int wake_[2] = {-1, -1};      // a self-pipe that ends read_loop
  std::string partial_[2];      // a line not ended yet, by stream (reader thread only)
  std::thread reader_;
};

}  // namespace castmesh::output
