#include "core/output/output_service.h"

#include <unistd.h>

#include <cerrno>
#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/output.h"
#include "castmesh/wire/v1/output.pb.h"
#include "core/proc/proc_host.h"
#include "core/wire/status_code.h"

namespace castmesh::output {
namespace {

namespace v1 = wire::v1;

// Lines go in batches of about this many bytes.
constexpr size_t kBatchBytes = 64 * 1024;

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kOutputService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<OutputService>(host);
  });
  return true;
}();

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (!(n < 0 && errno == EINTR)) {
      return;
    }
  }
}

}  // namespace

OutputService::OutputService(proc::ProcHost& host) : host_(host) {
  host.on_data(kOutputDataType, [this](const ProcId& peer, std::string_view header, wire::Payload payload) {
    on_lines(peer, header, payload.view());
  });
  host.on_control(v1::OutputForwarding().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    handle_forwarding(peer, correlation, payload);
                  });
  host.on_control(v1::OutputFlush().GetTypeName(), [this](const ProcId& peer, uint64_t correlation, const std::string&) {
    v1::OutputForwardingReply reply;
    (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
  });
}

OutputService::~OutputService() { detach(); }

std::shared_ptr<OutputService> OutputService::of(proc::ProcHost& host) {
  return std::dynamic_pointer_cast<OutputService>(host.service(kOutputService));
}

void OutputService::label(const ProcId& proc, std::string label, absl::Duration window) {
  detail::MutexLock lock(mu_);
  labels_[proc] = Label{std::move(label), window};
  if (printer_ == nullptr) printer_ = std::make_unique<OutputPrinter>();
}

void OutputService::flush() {
  OutputPrinter* printer = nullptr;
  {
    detail::MutexLock lock(mu_);
    printer = printer_.get();
  }
  if (printer != nullptr) printer->flush();  // the printer lives until detach()
}

void OutputService::on_lines(const ProcId& peer, std::string_view header_bytes, std::string_view body) {
  v1::OutputLines header;
  if (!header.ParseFromArray(header_bytes.data(), static_cast<int>(header_bytes.size()))) return;
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find('\n', start);
    if (end == std::string_view::npos) break;
    lines.emplace_back(body.substr(start, end - start));
    start = end + 1;
  }
  detail::MutexLock lock(mu_);
  auto it = labels_.find(peer);
  if (printer_ == nullptr) printer_ = std::make_unique<OutputPrinter>();
  printer_->add(it != labels_.end() ? it->second.text : host_.describe(peer), header.stream() == 2 ? 2 : 1,
                std::move(lines), header.dropped(), it != labels_.end() ? it->second.window : absl::ZeroDuration());
}

void OutputService::handle_forwarding(const ProcId& peer, uint64_t correlation, const std::string& payload) {
  v1::OutputForwardingReply reply;
  v1::OutputForwarding request;
  if (!request.ParseFromString(payload)) {
    wire::status_to_wire(absl::InvalidArgumentError("malformed OutputForwarding"), &reply);
  } else {
    detail::MutexLock lock(mu_);
    if (capture_ == nullptr && !stopping_.load()) {
      backlog_ = std::make_shared<LineBacklog>(request.backlog_bytes() > 0 ? request.backlog_bytes()
                                                                            : kDefaultBacklogBytes);
      absl::StatusOr<std::unique_ptr<FdCapture>> capture = FdCapture::Start(backlog_);
      if (capture.ok()) {
        capture_ = *std::move(capture);
        sender_ = std::thread([this] { send_loop(); });
      } else {
        backlog_.reset();
        wire::status_to_wire(capture.status(), &reply);
      }
    }
    destination_ = peer;
    stream_to_client_ = request.stream_to_client();
  }
  (void)host_.send_control(peer, reply, correlation, /*is_reply=*/true);
}

void OutputService::deliver(std::vector<Line>& batch, uint64_t dropped) {
  ProcId destination;
  bool stream = false;
  int original[2] = {1, 2};
  {
    detail::MutexLock lock(mu_);
    destination = destination_;
    stream = stream_to_client_;
    if (capture_ != nullptr) {
      original[0] = capture_->original_fd(1);
      original[1] = capture_->original_fd(2);
    }
  }
  // One message per run of lines of one stream, in order.
  size_t i = 0;
  while (stream && i < batch.size()) {
    v1::OutputLines header;
    header.set_stream(static_cast<uint32_t>(batch[i].stream));
    header.set_dropped(dropped);
    std::string body;
    const int stream_of_run = batch[i].stream;
    size_t end = i;
    for (; end < batch.size() && batch[end].stream == stream_of_run; ++end) absl::StrAppend(&body, batch[end].text, "\n");
    auto owned = std::make_shared<std::string>(std::move(body));
    wire::Payload payload = wire::Payload::share(owned, owned->data(), owned->size());
    if (!host_.send_data(destination, kOutputDataType, header.SerializeAsString(), std::move(payload)).ok()) {
      break;  // the controller is gone: what is left goes where the output went before
    }
    dropped = 0;
    i = end;
  }
  if (dropped > 0) write_all(original[1], absl::StrCat("... ", dropped, " line(s) of output dropped\n"));
  for (; i < batch.size(); ++i) write_all(original[batch[i].stream == 2 ? 1 : 0], batch[i].text + "\n");
}

void OutputService::send_loop() {
  std::shared_ptr<LineBacklog> backlog;
  {
    detail::MutexLock lock(mu_);
    backlog = backlog_;
  }
  std::vector<Line> batch;
  for (;;) {
    batch.clear();
    const uint64_t dropped = backlog->take(&batch, kBatchBytes, absl::Milliseconds(100));
    if (!batch.empty() || dropped > 0) deliver(batch, dropped);
    if (batch.empty() && dropped == 0 && stopping_.load()) return;
  }
}

void OutputService::detach() {
  if (stopping_.exchange(true)) return;
  std::unique_ptr<FdCapture> capture;
  std::shared_ptr<LineBacklog> backlog;
  ProcId destination;
  bool stream = false;
  {
    detail::MutexLock lock(mu_);
    capture = std::move(capture_);
    backlog = backlog_;
    destination = destination_;
    stream = stream_to_client_;
  }
  // Puts fds 1 and 2 back and queues what was still in the pipes.
  capture.reset();
  if (backlog) backlog->close();
  if (sender_.joinable()) sender_.join();
  // Everything sent has arrived once the controller answers (same connection, in order).
  if (stream && !destination.empty()) (void)host_.request(destination, v1::OutputFlush(), absl::Seconds(2));
  std::unique_ptr<OutputPrinter> printer;
  {
    detail::MutexLock lock(mu_);
    printer = std::move(printer_);
  }
  printer.reset();  // writes what it holds
}

}  // namespace castmesh::output

namespace castmesh {

absl::Status forward_output(const ProcMesh& procs, const OutputForwardingOptions& options) {
  if (procs.size() == 0) return absl::OkStatus();
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(procs.runtime());
  if (host == nullptr) return absl::FailedPreconditionError("the proc mesh's runtime is not a proc");
  std::shared_ptr<output::OutputService> service = output::OutputService::of(*host);
  if (service == nullptr) return absl::InternalError("no output service on this proc");
  wire::v1::OutputForwarding request;
  request.set_stream_to_client(options.stream_to_client);
  request.set_backlog_bytes(options.backlog_bytes);
  std::vector<std::future<absl::Status>> answers;
  for (size_t i = 0; i < procs.size(); ++i) {
    const ProcInfo& info = procs.proc(i);
    absl::StatusOr<Point> point = procs.shape().point_at(i);
    std::vector<std::string> coords;
    if (point.ok()) {
      for (size_t d = 0; d < point->coords().size(); ++d) {
        coords.push_back(absl::StrCat(procs.shape().labels()[d], "=", point->coords()[d]));
      }
    }
    service->label(info.id,
                   absl::StrCat(coords.empty() ? absl::StrCat("rank ", info.rank) : absl::StrJoin(coords, ","),
                                info.hostname.empty() ? "" : "@", info.hostname),
                   options.aggregate_window);
    answers.push_back(std::async(std::launch::async, [&host, &request, id = info.id]() -> absl::Status {
      absl::StatusOr<std::string> payload = host->request(id, request, absl::Seconds(30));
      if (!payload.ok()) return payload.status();
      wire::v1::OutputForwardingReply reply;
      if (!reply.ParseFromString(*payload)) return absl::InternalError("malformed OutputForwardingReply");
      return wire::status_from_wire(reply);
    }));
  }
  absl::Status result;
  for (auto& answer : answers) result.Update(answer.get());
  return result;
}

absl::Status flush_forwarded_output(Runtime& runtime) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  if (host == nullptr) return absl::OkStatus();
  if (std::shared_ptr<output::OutputService> service = output::OutputService::of(*host)) service->flush();
  return absl::OkStatus();
}

}  // namespace castmesh
