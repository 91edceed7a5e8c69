// The public RdmaBuffer / RdmaBatch API: checks, the same-process copy, and
// cross-proc operations as link::Transfers on the routes the RDMA selector
// chooses (routes.h); the operations see only link::Link.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/rdma.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/link/transfers.h"
#include "core/platform/platform.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/handle.h"
#include "core/rdma/registration.h"
#include "core/rdma/registry.h"
#include "core/rdma/routes.h"
#include "core/trace/recorder.h"
#include "core/wire/frame.h"

namespace castmesh {

namespace {

using link::Transfer;
using link::Transfers;

using rdma::offers;
using rdma::owner_on_device;

bool same_process(const detail::RdmaHandle& handle) {
  return handle.pid == ::getpid() && handle.host_identity == platform::host_identity();
}

// The local side of an operation: host (or device memory, staged), contiguous,
// big enough, writable for reads.
absl::Status check_local(const TensorView& view, bool destination, size_t length) {
  const char* role = destination ? "destination" : "source";
  if (!view.device().is_host_accessible() && !rdma::is_device_memory(view)) {
    return absl::InvalidArgumentError(absl::StrCat("the ", role, " is ", view.device().to_string(),
                                                   " memory; RDMA buffers move host, CUDA or ROCm memory (stage it "
                                                   "to the CPU)"));
  }
  if (!view.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", role, " ", view.to_string(), " is not contiguous"));
  }
  if (destination && view.read_only()) {
    return absl::InvalidArgumentError(absl::StrCat("the destination ", view.to_string(), " is read-only"));
  }
  if (view.nbytes() < length) {
    return absl::InvalidArgumentError(absl::StrCat("the ", role, " holds ", view.nbytes(), " bytes, the operation moves ",
                                                   length));
  }
  return absl::OkStatus();
}

Runtime* runtime_for(Runtime* given) { return given != nullptr ? given : Runtime::current(); }

// Copies within this process, holding the registration while it copies.
Future<RdmaResult> same_process_copy(const detail::RdmaHandle& handle, char* local, bool write, uint64_t offset,
                                     size_t length) {
  auto opened = rdma::Registry::instance().open(handle.id, write, offset, length);
  if (!opened.ok()) return make_failed_future<RdmaResult>(opened.status());
  const rdma::Registration& registration = **opened;
  if (rdma::is_device_memory(registration.view)) {
    absl::Status copied = write ? rdma::copy_in(registration, offset, local, length)
                                : rdma::copy_out(registration, offset, local, length);
    if (!copied.ok()) return make_failed_future<RdmaResult>(copied);
    return make_ready_future(RdmaResult{length, RdmaTransport::kSameProcess, true});
  }
  char* remote = registration.base + offset;
  if (length > 0) write ? std::memmove(remote, local, length) : std::memmove(local, remote, length);
  return make_ready_future(RdmaResult{length, RdmaTransport::kSameProcess});
}

// Starts a cross-proc transfer; its Future completes from Transfers.
Future<RdmaResult> start_transfer(std::shared_ptr<Transfer> transfer, Runtime* runtime, absl::Duration timeout) {
  if (runtime == nullptr) {
    return make_failed_future<RdmaResult>(absl::FailedPreconditionError(
        "no castmesh runtime in this process: RDMA operations need one (create a Runtime or run inside an actor)"));
  }
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(*runtime);
  if (host == nullptr) {
    return make_failed_future<RdmaResult>(absl::FailedPreconditionError(absl::StrCat(
        "runtime ", runtime->proc_id(), " is not a proc of a mesh, so it cannot reach proc ", transfer->remote.owner)));
  }
  auto* state = new detail::FutureState<RdmaResult>();
  state->ref();  // the transfer's reference, dropped when it completes
  Future<RdmaResult> future(state);
  transfer->id = Transfers::instance().next_id();
  transfer->host = host;
  transfer->done = [state](absl::StatusOr<RdmaResult> result) {
    state->set(std::move(result));
    state->unref();
  };
  Transfers::instance().start(transfer, timeout);
  link::start_next(transfer);
  return future;
}

Future<RdmaResult> operate(const std::shared_ptr<const detail::RdmaHandle>& handle, const TensorView& local,
                           bool write, const RdmaOptions& options) {
  if (handle == nullptr) {
    return make_failed_future<RdmaResult>(absl::FailedPreconditionError("an empty RdmaBuffer handle"));
  }
  const size_t length = write ? local.nbytes() : options.length.value_or(local.nbytes());
  if (absl::Status ok = check_local(local, !write, length); !ok.ok()) return make_failed_future<RdmaResult>(ok);
  const std::string what = absl::StrCat("RDMA buffer ", handle->id, " of proc ", handle->owner);
  if (absl::Status ok = rdma::check_operation(what, handle->size, handle->access, write, options.offset, length);
      !ok.ok()) {
    return make_failed_future<RdmaResult>(ok);
  }
  if (rdma::is_device_memory(local)) {
    return rdma::staged(local, write, length, [handle, write, options, length](const TensorView& host) {
      RdmaOptions on_host = options;
      on_host.length = length;
      return operate(handle, host, write, on_host);
    });
  }
  char* bytes = static_cast<char*>(local.data());
  if (same_process(*handle)) return same_process_copy(*handle, bytes, write, options.offset, length);
  absl::StatusOr<link::Routes> routes = rdma::choose_routes(*handle, length, options.fallback);
  if (!routes.ok()) return make_failed_future<RdmaResult>(routes.status());
  // A link that completes small operations on this thread (a same-host one-sided copy) does so now.
  link::Link* first = routes->front();
  if (std::optional<absl::Status> now = first->start_now(handle->region, options.offset, bytes, length, write)) {
    if (!now->ok()) return make_failed_future<RdmaResult>(*now);
    return make_ready_future(RdmaResult{length, rdma::transport_of(first->path(handle->owner))});
  }
  auto transfer = std::make_shared<Transfer>();
  transfer->remote = handle->region;
  transfer->write = write;
  transfer->offset = options.offset;
  transfer->length = length;
  transfer->local = local;
  transfer->bytes = bytes;
  transfer->routes = *std::move(routes);
  Future<RdmaResult> started = start_transfer(std::move(transfer), runtime_for(options.runtime), options.timeout);
  if (!owner_on_device(*handle)) return started;
  return std::move(started).then([](RdmaResult r) {
    r.staged = true;  // the owner staged its device memory
    return r;
  });
}

absl::Status encode_buffer(const RdmaBuffer& buffer, std::string* out) {
  *out = buffer.serialize();
  return absl::OkStatus();
}

absl::Status decode_buffer(std::string_view bytes, RdmaBuffer* buffer) {
  absl::StatusOr<RdmaBuffer> decoded = RdmaBuffer::deserialize(bytes);
  if (!decoded.ok()) return decoded.status();
  *buffer = *std::move(decoded);
  return absl::OkStatus();
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(RdmaBuffer, "castmesh.RdmaBuffer", encode_buffer, decode_buffer);

std::string_view rdma_transport_name(RdmaTransport transport) {
  switch (transport) {
    case RdmaTransport::kIbverbs: return "ibverbs";
    case RdmaTransport::kSameProcess: return "same_process";
    case RdmaTransport::kSingleCopy: return "single_copy";
    case RdmaTransport::kSocket: return "socket";
    case RdmaTransport::kSharedSegment: return "shared_segment";
  }
  return "unknown";
}

std::string rdma_result_transport(const RdmaResult& result) {
  return std::string(rdma_transport_name(result.transport)) + (result.staged ? "+host_staging" : "");
}

RdmaBuffer::RdmaBuffer() = default;

absl::StatusOr<RdmaBuffer> RdmaBuffer::register_memory(const TensorView& view, RdmaAccess access, Runtime* runtime) {
  const auto bits = static_cast<uint32_t>(access);
  if (bits == 0 || bits > 3) return absl::InvalidArgumentError(absl::StrCat("unknown RdmaAccess ", bits));
  const bool device = rdma::is_device_memory(view);
  if (device) {
    absl::Status usable =
        rdma::check_device_backend(view, absl::StrCat("an RDMA buffer over ", view.device().to_string(), " memory"));
    if (!usable.ok()) return usable;
  } else if (!view.device().is_host_accessible()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot register ", view.device().to_string(),
                                                   " memory: RDMA buffers hold host, CUDA or ROCm memory; register a "
                                                   "host copy"));
  }
  if (!view.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot register ", view.to_string(), ": not contiguous"));
  }
  if ((bits & static_cast<uint32_t>(RdmaAccess::kWrite)) != 0 && view.read_only()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot register ", view.to_string(), " for writing: it is read-only (use RdmaAccess::kRead)"));
  }
  Runtime* rt = runtime_for(runtime);
  if (rt == nullptr) {
    return absl::FailedPreconditionError("no castmesh runtime in this process: register RDMA buffers inside one");
  }
  rdma::Registered registered = rdma::register_with_paths(view, access, rt->proc_id(), device);
  auto handle = std::make_shared<detail::RdmaHandle>();
  handle->id = registered.registration->id;
  handle->owner = rt->proc_id();
  handle->size = registered.registration->size;
  handle->access = access;
  handle->pid = ::getpid();
  handle->host_identity = platform::host_identity();
  handle->transports = std::move(registered.transports);
  handle->nic_address = registered.registration->nic_address;
  handle->rkey = registered.registration->rkey;
  handle->one_sided = registered.table;
  handle->device = view.device();
  handle->region = rdma::region_of(*handle);
  return RdmaBuffer(std::move(handle));
}

std::string RdmaBuffer::serialize() const {
  if (handle_ == nullptr) return {};
  wire::v1::RdmaHandle wire;
  wire.set_id(handle_->id);
  wire.set_owner(handle_->owner);
  wire.set_size(handle_->size);
  wire.set_access(static_cast<uint32_t>(handle_->access));
  wire.set_pid(handle_->pid);
  wire.set_host_identity(handle_->host_identity);
  for (RdmaTransport t : handle_->transports) wire.add_transports(static_cast<uint32_t>(t));
  wire.set_nic_address(handle_->nic_address);
  wire.set_rkey(handle_->rkey);
  wire.set_one_sided_slot(handle_->one_sided.slot);
  wire.set_one_sided_generation(handle_->one_sided.generation);
  wire.set_device_type(static_cast<int32_t>(handle_->device.kind));
  wire.set_device_index(handle_->device.index);
  return wire.SerializeAsString();
}

absl::StatusOr<RdmaBuffer> RdmaBuffer::deserialize(std::string_view bytes) {
  if (bytes.empty()) return RdmaBuffer();
  wire::v1::RdmaHandle wire;
  if (!castmesh::wire::parse_message(bytes, wire) || wire.owner().empty() ||
      wire.access() == 0 || wire.access() > 3) {
    return absl::InvalidArgumentError("malformed RdmaBuffer handle");
  }
  auto handle = std::make_shared<detail::RdmaHandle>();
  handle->id = wire.id();
  handle->owner = wire.owner();
  handle->size = wire.size();
  handle->access = static_cast<RdmaAccess>(wire.access());
  handle->pid = wire.pid();
  handle->host_identity = wire.host_identity();
  handle->nic_address = wire.nic_address();
  handle->rkey = wire.rkey();
  handle->one_sided = rdma::OneSidedRef{wire.one_sided_slot(), wire.one_sided_generation()};
  // An unset (0) device is an older peer's host buffer.
  if (wire.device_type() != 0) handle->device = Device{static_cast<DeviceKind>(wire.device_type()), wire.device_index()};
  for (uint32_t t : wire.transports()) {
    // Transports of a newer peer that this build does not know are skipped.
    if (t >= static_cast<uint32_t>(RdmaTransport::kIbverbs) &&
        t <= static_cast<uint32_t>(RdmaTransport::kSharedSegment)) {
      handle->transports.push_back(static_cast<RdmaTransport>(t));
    }
  }
  handle->region = rdma::region_of(*handle);
  return RdmaBuffer(std::move(handle));
}

size_t RdmaBuffer::size() const { return handle_ ? handle_->size : 0; }

const ProcId& RdmaBuffer::owner() const {
  static const ProcId none;
  return handle_ ? handle_->owner : none;
}

RdmaAccess RdmaBuffer::access() const { return handle_ ? handle_->access : RdmaAccess::kRead; }

std::vector<RdmaTransport> RdmaBuffer::transports() const {
  return handle_ ? handle_->transports : std::vector<RdmaTransport>{};
}

Device RdmaBuffer::device() const { return handle_ ? handle_->device : Device{}; }

namespace {

// While a trace records, an RDMA operation is an async slice ("rdma read" /
// "rdma write") from the call to its completion, wherever that runs; its end
// says the path that moved the bytes (or the error), and its begin the bytes.
Future<RdmaResult> traced(Future<RdmaResult> operation, bool write, size_t bytes) {
  if (!trace::on()) return operation;
  const uint32_t name = trace::intern_cached(write ? "rdma write" : "rdma read");
  const uint64_t id = trace::new_flow_id();
  trace::record(trace::Record{trace::now_ns(), 0, id, bytes, name, 0, trace::Category::kRdma,
                              trace::RecordKind::kAsyncBegin});
  auto* state = new detail::FutureState<RdmaResult>();
  state->ref();  // the continuation's reference
  Future<RdmaResult> out(state);
  std::move(operation).on_ready([state, name, id](absl::StatusOr<RdmaResult> result) {
    const std::string how = result.ok() ? rdma_result_transport(*result) : absl::StrCat("failed: ", result.status().code());
    trace::record(trace::Record{trace::now_ns(), 0, id, 0, name, trace::intern_cached(how), trace::Category::kRdma,
                                trace::RecordKind::kAsyncEnd});
    state->set(std::move(result));
    state->unref();
  });
  return out;
}

}  // namespace

Future<RdmaResult> RdmaBuffer::read_into(const TensorView& dst, RdmaOptions options) const {
  const size_t bytes = options.length.value_or(dst.nbytes());
  return traced(operate(handle_, dst, /*write=*/false, options), false, bytes);
}

Future<RdmaResult> RdmaBuffer::write_from(const TensorView& src, RdmaOptions options) const {
  return traced(operate(handle_, src, /*write=*/true, options), true, src.nbytes());
}

Future<Unit> RdmaBuffer::release(absl::Duration timeout, Runtime* runtime) const {
  if (handle_ == nullptr) return make_ready_future(Unit{});
  if (same_process(*handle_)) {
    std::shared_ptr<const rdma::Registration> released = rdma::Registry::instance().release(handle_->id);
    if (released == nullptr) return make_ready_future(Unit{});
    Runtime* rt = runtime_for(runtime);
    std::shared_ptr<proc::ProcHost> host = rt != nullptr ? proc::ProcHost::of(*rt) : nullptr;
    rdma::retire_from_paths(released, host.get());
    // Ready once no transport uses the memory any more (ibverbs peers drained, copies done).
    auto* state = new detail::FutureState<Unit>();
    state->ref();  // the callback's reference
    Future<Unit> freed(state);
    rdma::when_freed(std::move(released), [state] {
      state->set(Unit{});
      state->unref();
    });
    return freed;
  }
  auto transfer = std::make_shared<Transfer>();
  transfer->remote = handle_->region;
  transfer->release = true;
  transfer->routes = rdma::release_routes();
  return start_transfer(std::move(transfer), runtime_for(runtime), timeout).then([](RdmaResult) { return Unit{}; });
}

std::string RdmaBuffer::to_string() const {
  if (handle_ == nullptr) return "RdmaBuffer(empty)";
  const char* access = handle_->access == RdmaAccess::kRead    ? "read"
                       : handle_->access == RdmaAccess::kWrite ? "write"
                                                               : "read_write";
  const std::string where = owner_on_device(*handle_) ? absl::StrCat(", ", handle_->device.to_string()) : "";
  return absl::StrCat("RdmaBuffer(", handle_->size, " bytes of ", handle_->owner, ", ", access, where, ")");
}

// ---- RdmaBatch ----

absl::Status RdmaBatch::add_read(const RdmaBuffer& buffer, const TensorView& dst, RdmaOptions options) {
  if (submitted_) return absl::FailedPreconditionError("this RdmaBatch was already submitted");
  ops_.push_back(Op{buffer, dst, options, false});
  return absl::OkStatus();
}

absl::Status RdmaBatch::add_write(const RdmaBuffer& buffer, const TensorView& src, RdmaOptions options) {
  if (submitted_) return absl::FailedPreconditionError("this RdmaBatch was already submitted");
  const size_t begin = options.offset;
  const size_t end = begin + src.nbytes();
  for (const Op& op : ops_) {
    const bool same_buffer = op.buffer.owner() == buffer.owner() && op.buffer.valid() && buffer.valid() &&
                             op.buffer.handle_->id == buffer.handle_->id;
    if (!op.write || !same_buffer) continue;
    const size_t other_begin = op.options.offset;
    const size_t other_end = other_begin + op.view.nbytes();
    if (begin < other_end && other_begin < end) {
      return absl::InvalidArgumentError(absl::StrCat("the write of [", begin, ", ", end, ") overlaps the write of [",
                                                     other_begin, ", ", other_end,
                                                     ") already in this batch (their order would be undefined)"));
    }
  }
  ops_.push_back(Op{buffer, src, options, true});
  return absl::OkStatus();
}

Future<std::vector<RdmaResult>> RdmaBatch::submit(absl::Duration timeout, Runtime* runtime) {
  if (submitted_) {
    return make_failed_future<std::vector<RdmaResult>>(
        absl::FailedPreconditionError("this RdmaBatch was already submitted"));
  }
  submitted_ = true;
  std::vector<Future<RdmaResult>> futures;
  futures.reserve(ops_.size());
  for (Op& op : ops_) {
    op.options.timeout = timeout;
    if (op.options.runtime == nullptr) op.options.runtime = runtime;
    futures.push_back(op.write ? op.buffer.write_from(op.view, op.options) : op.buffer.read_into(op.view, op.options));
  }
  return when_all(std::move(futures));
}

}  // namespace castmesh
