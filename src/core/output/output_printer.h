// The controller's end of output forwarding: writes the lines procs sent to
// this process's stdout and stderr, each prefixed with the proc's label
// ("hosts=1,procs=0@node7"), from a thread of its own (a full terminal
// pipe never stalls the transport). With an aggregation window, identical
// lines of many procs within the window are written once with a count.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::output {

class OutputPrinter {
 public:
  OutputPrinter();
  // Writes what is queued, then stops.
  ~OutputPrinter();
  OutputPrinter(const OutputPrinter&) = delete;
  OutputPrinter& operator=(const OutputPrinter&) = delete;

  // Queues `lines` of stream 1 or 2 from the proc labelled `label`, after a
  // notice for `dropped` lines it lost. Never blocks on the terminal.
  void add(const std::string& label, int stream, std::vector<std::string> lines, uint64_t dropped,
           absl::Duration window);
  // Returns once everything queued before the call is written.
  void flush();

 private:
  struct Entry {
    std::string label;
    int stream = 1;
    std::string text;
    absl::Duration window;
  };
  // An aggregated line: written once for every proc that wrote it.
  struct Aggregate {
    std::string first_label;
    size_t count = 0;
  };
  void loop();
  void write_line(int stream, const std::string& prefix, const std::string& text);
  void flush_aggregates() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  detail::Mutex mu_;
  detail::CondVar cv_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;   // entries ever queued
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // entries handled (written or aggregated)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The current aggregation window: lines by (stream, text) in first-seen order.
  std::vector<std::pair<std::pair<int, std::string>, Aggregate>> aggregates_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> aggregate_index_ ABSL_GUARDED_BY(mu_);
  absl::Time window_end_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread thread_;
};

}  // namespace castmesh::output
