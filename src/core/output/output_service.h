// Output forwarding, a proc service of every proc (docs/procs.md, "Output of
// procs"). In a worker proc, once a controller asks (OutputForwarding), it
// captures fds 1 and 2 (FdCapture) and a sender thread sends the lines to
// that controller in batches (or writes them through to where they went
// before); at the proc's end it flushes them (OutputFlush). In a
// controller, it prints what its procs send (OutputPrinter) under the label
// each proc was given by forward_output().
//
// Threading: handlers on the host's I/O thread (or a reader's); the sender
// and printer have threads of their own; forward_output blocks its caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "castmesh/address.h"
#include "castmesh/detail/mutex.h"
#include "core/output/fd_capture.h"
#include "core/output/line_backlog.h"
#include "core/output/output_printer.h"
#include "core/proc/proc_service.h"

namespace castmesh::proc {
class ProcHost;
}  // namespace castmesh::proc

namespace castmesh::output {

inline constexpr char kOutputService[] = "output";
inline constexpr char kOutputDataType[] = "castmesh.output";
// A proc's unsent lines are kept up to this many bytes by default.
inline constexpr uint64_t kDefaultBacklogBytes = uint64_t{8} << 20;

class OutputService : public proc::ProcService {
 public:
  explicit OutputService(proc::ProcHost& host);
  ~OutputService() override;
  // The service of `host` (installed on every ProcHost), or nullptr.
  static std::shared_ptr<OutputService> of(proc::ProcHost& host);

  // Controller: how lines of `proc` are labelled and aggregated.
  void label(const ProcId& proc, std::string label, absl::Duration window);
  // Controller: returns once every line received so far is written.
  void flush();

  void detach() override;

 private:
  void handle_forwarding(const ProcId& peer, uint64_t correlation, const std::string& payload);
  void on_lines(const ProcId& peer, std::string_view header, std::string_view body);
  void send_loop();
  // Sends or writes through one batch (sender thread).
  void deliver(std::vector<Line>& batch, uint64_t dropped);

  proc::ProcHost& host_;
  detail::Mutex mu_;
  // Controller side.
  struct Label {
    std::string text;
    absl::Duration window;
  };
  absl::flat_hash_map<ProcId, Label> labels_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<OutputPrinter> printer_ ABSL_GUARDED_BY(mu_);
  // Worker side.
  std::shared_ptr<LineBacklog> backlog_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FdCapture> capture_ ABSL_GUARDED_BY(mu_);
  ProcId destination_ ABSL_GUARDED_BY(mu_);  // the controller that asked
  bool stream_to_client_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};
  std::thread sender_;
};

}  // namespace castmesh::output
