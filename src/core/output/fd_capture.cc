#include "core/output/fd_capture.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace castmesh::output {
namespace {

// A line without a newline yet is sent after this much silence (a progress
// bar, a prompt), so it is not held back forever.
constexpr int kPartialFlushMs = 200;

int cloexec_pipe(int fds[2]) {
  if (::pipe(fds) != 0) return -1;
  ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  return 0;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdCapture>> FdCapture::Start(std::shared_ptr<LineBacklog> backlog) {
  std::unique_ptr<FdCapture> capture(new FdCapture(std::move(backlog)));
  auto fail = [&](const char* what) {
    const int err = errno;
    for (int i = 0; i < 2; ++i) {
      if (capture->original_[i] >= 0) ::dup2(capture->original_[i], i + 1);
      close_fd(capture->original_[i]);
      close_fd(capture->read_end_[i]);
    }
    close_fd(capture->wake_[0]);
    close_fd(capture->wake_[1]);
    return absl::UnavailableError(absl::StrCat("cannot capture this proc's output: ", what, ": ", std::strerror(err)));
  };
  if (cloexec_pipe(capture->wake_) != 0) return fail("pipe");
  for (int i = 0; i < 2; ++i) {
    const int fd = i + 1;
    ::fflush(i == 0 ? stdout : stderr);  // what C stdio buffered goes where it was meant to
    capture->original_[i] = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (capture->original_[i] < 0) return fail("dup");
    int p[2];
    if (cloexec_pipe(p) != 0) return fail("pipe");
    // dup2 leaves the new fd 1/2 inheritable: children keep writing into the capture.
    if (::dup2(p[1], fd) < 0) {
      close_fd(p[0]);
      close_fd(p[1]);
      return fail("dup2");
    }
    ::close(p[1]);
    ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
    capture->read_end_[i] = p[0];
  }
  capture->reader_ = std::thread([raw = capture.get()] { raw->read_loop(); });
  return capture;
}

FdCapture::~FdCapture() {
  for (int i = 0; i < 2; ++i) {
    ::fflush(i == 0 ? stdout : stderr);
    if (original_[i] >= 0) ::dup2(original_[i], i + 1);
  }
  if (wake_[1] >= 0) {
    const char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
  }
  if (reader_.joinable()) reader_.join();
  for (int i = 0; i < 2; ++i) {
    close_fd(original_[i]);
    close_fd(read_end_[i]);
  }
  close_fd(wake_[0]);
  close_fd(wake_[1]);
}

void FdCapture::flush_partial(int index) {
  if (partial_[index].empty()) return;
  backlog_->push(index + 1, std::move(partial_[index]));
  partial_[index].clear();
}

bool FdCapture::drain(int index) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(read_end_[index], buffer, sizeof(buffer));
    if (n > 0) {
      size_t start = 0;
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        if (buffer[i] != '\n') continue;
        partial_[index].append(buffer + start, i - start);
        backlog_->push(index + 1, std::move(partial_[index]));
        partial_[index].clear();
        start = i + 1;
      }
      partial_[index].append(buffer + start, static_cast<size_t>(n) - start);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // 0: every writer is gone
  }
}

void FdCapture::read_loop() {
  bool open[2] = {true, true};
  for (;;) {
    const auto events = [](bool readable) { return static_cast<short>(readable ? POLLIN : 0); };
    pollfd fds[3] = {{read_end_[0], events(open[0]), 0}, {read_end_[1], events(open[1]), 0}, {wake_[0], POLLIN, 0}};
    const int ready = ::poll(fds, 3, kPartialFlushMs);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (open[i] && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) open[i] = drain(i);
    }
    if (ready == 0) {  // silence: a pending partial line goes as it is
      flush_partial(0);
      flush_partial(1);
    }
    if ((fds[2].revents & POLLIN) != 0 || (!open[0] && !open[1])) break;
  }
  // Stopping: fds 1 and 2 are restored; take what the pipes still hold
  // (writers that kept a copy of them, e.g. children, may still add more:
  // that is theirs to lose).
  for (int i = 0; i < 2; ++i) {
    (void)drain(i);
    flush_partial(i);
  }
}

}  // namespace castmesh::output
