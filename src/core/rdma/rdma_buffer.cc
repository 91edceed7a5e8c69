// The public RdmaBuffer / RdmaBatch API: checks, transport choice, and the
// same-process path. Cross-proc operations run through Transfers and the
// "rdma" proc service (service.h).
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
#include "core/link/selector.h"
#include "core/link/single_copy.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/ibverbs_path.h"
#include "core/rdma/one_sided.h"
#include "core/rdma/registry.h"
#include "core/rdma/segment_path.h"
#include "core/rdma/service.h"
#include "core/rdma/transfers.h"
#include "core/tensor/device_engine.h"
#include "core/trace/recorder.h"
#include "core/wire/frame.h"

namespace castmesh {

namespace detail {
// What an RdmaBuffer handle knows of its buffer (RdmaHandle on the wire).
struct RdmaHandle {
  uint64_t id = 0;
  ProcId owner;
  size_t size = 0;
  RdmaAccess access = RdmaAccess::kReadWrite;
  int64_t pid = 0;
  std::string host_identity;
  std::vector<RdmaTransport> transports;
  uint64_t nic_address = 0;  // ibverbs: 0 when the owner registered no NIC range
  uint32_t rkey = 0;
  rdma::OneSidedRef one_sided;  // same-host one-sided copies (generation 0: none)
  Device device;                // the owner's memory: CUDA/ROCm memory is staged by the owner
};
}  // namespace detail

namespace {

using rdma::Transfer;

// One-sided copies below this size run on the calling thread (larger ones
// on a thread of their own, under a timeout, as every transfer): a 4 MiB
// copy takes a few hundred microseconds, less than what handing it to a
// thread and waking the caller costs at 1 MiB on a loaded machine.
constexpr size_t kOneSidedInCallerBytes = size_t{4} << 20;

bool offers(const detail::RdmaHandle& handle, RdmaTransport transport) {
  return std::find(handle.transports.begin(), handle.transports.end(), transport) != handle.transports.end();
}

// Whether the owner's memory is CUDA/ROCm memory (it stages every operation).
bool owner_on_device(const detail::RdmaHandle& handle) {
  return castmesh::detail::is_engine_device(handle.device);
}

bool same_process(const detail::RdmaHandle& handle) {
  return handle.pid == ::getpid() && handle.host_identity == platform::host_identity();
}

// CASTMESH_RDMA_FALLBACK (or the operation's own, `chosen`): OK(true) =
// "error" (no fallback), OK(false) = "auto"; the environment's error when a
// setting there is unknown or malformed.
absl::StatusOr<bool> fallback_forbidden(std::optional<config::RdmaFallback> chosen) {
  if (absl::Status settings = config::check_environment(); !settings.ok()) return settings;
  return chosen.value_or(config::global().rdma_fallback) == config::RdmaFallback::kError;
}

// Whether ibverbs can carry operations on `handle` (of any size: a 0-byte
// READ/WRITE is a legal work request).
bool ibverbs_reaches(const detail::RdmaHandle& handle) {
  return offers(handle, RdmaTransport::kIbverbs) && handle.nic_address != 0 &&
         rdma::IbverbsPath::instance().reachable(handle.owner);
}

// Why ibverbs does not carry operations on `handle`, for the log and errors.
std::string why_no_ibverbs(const detail::RdmaHandle& handle) {
  rdma::IbverbsPath& path = rdma::IbverbsPath::instance();
  if (!path.usable()) return path.why_not();
  if (owner_on_device(handle)) {
    return absl::StrCat("proc ", handle.owner, "'s buffer is ", handle.device.to_string(),
                        " memory, which castmesh never registers with a NIC (GPUDirect RDMA is not implemented)");
  }
  if (!offers(handle, RdmaTransport::kIbverbs) || handle.nic_address == 0) {
    return absl::StrCat("proc ", handle.owner, " registered its buffer without an RDMA NIC");
  }
  return path.why_unreachable(handle.owner);
}

// The transport for an operation of `length` bytes on `handle` (`fallback`:
// the operation's own setting, if any), or why none: the link layer's cost
// table (core/link/selector.h) over the paths the owner offers and this
// process can use.
absl::StatusOr<RdmaTransport> choose_transport(const detail::RdmaHandle& handle, size_t length,
                                               std::optional<config::RdmaFallback> fallback) {
  absl::StatusOr<bool> forbidden = fallback_forbidden(fallback);
  if (!forbidden.ok()) return forbidden.status();
  const link::Placement placement = handle.host_identity == platform::host_identity() ? link::Placement::kSameHost
                                                                                      : link::Placement::kOtherHost;
  link::Available available;
  if (ibverbs_reaches(handle)) available.add(link::Path::kIbverbs);
  if (!available.has(link::Path::kIbverbs)) {
    if (*forbidden) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CASTMESH_RDMA_FALLBACK=error and no ibverbs path to proc ", handle.owner, " (", why_no_ibverbs(handle),
          "); set CASTMESH_RDMA_FALLBACK=auto to use same-host single copy or the socket transport"));
    }
    static std::once_flag logged;
    std::call_once(logged, [&handle] {
      CASTMESH_LOG_INFO("castmesh-rdma: {}; RDMA buffers between procs use same-host single copy (or a shared "
                        "segment) and the socket transport (CASTMESH_RDMA_FALLBACK=error forbids that)",
                        why_no_ibverbs(handle));
    });
    if (CASTMESH_LINUX_FACILITIES && config::global().rdma_single_copy &&
        offers(handle, RdmaTransport::kSingleCopy) && link::single_copy_usable()) {
      available.add(link::Path::kSingleCopy);
    }
    // Where the kernel refuses (or the switch forbids) single copy.
    if (placement == link::Placement::kSameHost && offers(handle, RdmaTransport::kSharedSegment) &&
        rdma::shared_segment_reaches(handle.owner)) {
      available.add(link::Path::kSharedSegment);
    }
    if (offers(handle, RdmaTransport::kSocket)) available.add(link::Path::kSocket);
  }
  switch (link::choose(placement, length, available).value_or(link::Path::kFake)) {
    case link::Path::kIbverbs: return RdmaTransport::kIbverbs;
    case link::Path::kSingleCopy: return RdmaTransport::kSingleCopy;
    case link::Path::kSharedSegment: return RdmaTransport::kSharedSegment;
    case link::Path::kSocket: return RdmaTransport::kSocket;
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("proc ", handle.owner, " offers no transport this proc has for its RDMA buffer"));
  }
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
        "runtime ", runtime->proc_id(), " is not a proc of a mesh, so it cannot reach proc ", transfer->owner)));
  }
  auto* state = new detail::FutureState<RdmaResult>();
  state->ref();  // the transfer's reference, dropped when it completes
  Future<RdmaResult> future(state);
  transfer->id = rdma::Transfers::instance().next_id();
  transfer->host = host;
  transfer->done = [state](absl::StatusOr<RdmaResult> result) {
    state->set(std::move(result));
    state->unref();
  };
  rdma::Transfers::instance().start(transfer, timeout);
  rdma::begin(transfer);
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
  absl::StatusOr<RdmaTransport> transport = choose_transport(*handle, length, options.fallback);
  if (!transport.ok()) return make_failed_future<RdmaResult>(transport.status());
  // Same host: a one-sided copy first, with no message to the owner (one_sided.h).
  const bool one_sided = *transport != RdmaTransport::kIbverbs && handle->one_sided.generation != 0 &&
                         handle->host_identity == platform::host_identity() &&
                         offers(*handle, RdmaTransport::kSingleCopy) && rdma::one_sided_enabled();
  if (one_sided && length < kOneSidedInCallerBytes) {
    auto now = rdma::one_sided_now(handle->owner, handle->pid, handle->id, handle->one_sided, bytes, write,
                                   options.offset, length);
    if (now) return now->ok() ? make_ready_future(**now) : make_failed_future<RdmaResult>(now->status());
  }
  auto transfer = std::make_shared<Transfer>();
  transfer->owner = handle->owner;
  transfer->buffer = handle->id;
  transfer->write = write;
  transfer->offset = options.offset;
  transfer->length = length;
  transfer->local = local;
  transfer->bytes = bytes;
  transfer->transport = *transport;
  transfer->owner_pid = handle->pid;
  transfer->segment_offered = offers(*handle, RdmaTransport::kSharedSegment);
  transfer->remote_address = handle->nic_address;
  transfer->rkey = handle->rkey;
  transfer->one_sided = one_sided && rdma::one_sided_enabled();  // re-read: a refusal just now turns it off
  transfer->one_sided_slot = handle->one_sided.slot;
  transfer->one_sided_generation = handle->one_sided.generation;
  Future<RdmaResult> started = start_transfer(std::move(transfer), runtime_for(options.runtime), options.timeout);
  if (!owner_on_device(*handle)) return started;
  return std::move(started).then([](RdmaResult r) {
    r.staged = true;  // the owner staged its device memory
    return r;
  });
}

// Device memory: only the transports in which the owner's CPU stages the
// bytes (a peer's process_vm_readv and the NIC cannot reach it).
std::vector<RdmaTransport> transports_of_this_proc(bool nic, bool device) {
  std::vector<RdmaTransport> offered;
  if (nic) offered.push_back(RdmaTransport::kIbverbs);
  offered.push_back(RdmaTransport::kSameProcess);
  if (CASTMESH_LINUX_FACILITIES && !device) offered.push_back(RdmaTransport::kSingleCopy);
  offered.push_back(RdmaTransport::kSharedSegment);  // POSIX shm_open: every build
  offered.push_back(RdmaTransport::kSocket);
  return offered;
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
  // The NIC registration (ibverbs) when this process has a NIC; without
  // one (or when the NIC refuses the range) the buffer offers the others.
  rdma::NicRange nic;
  // (GPUDirect RDMA is not implemented: device memory is never given to the NIC.)
  if (view.nbytes() > 0 && !device && rdma::IbverbsPath::instance().usable()) {
    absl::StatusOr<rdma::NicRange> registered =
        rdma::IbverbsPath::instance().register_range(view.data(), view.nbytes(), access);
    if (registered.ok()) {
      nic = *std::move(registered);
    } else {
      CASTMESH_LOG_WARN_LIMITED("castmesh-rdma: the NIC refused to register {} ({}); this buffer is offered over "
                                "the other transports",
                                view.to_string(), std::string(registered.status().message()));
    }
  }
  std::shared_ptr<const rdma::Registration> registration =
      rdma::Registry::instance().add(view, access, rt->proc_id(), nic.registration, nic.rkey);
  auto handle = std::make_shared<detail::RdmaHandle>();
  handle->id = registration->id;
  handle->owner = rt->proc_id();
  handle->size = registration->size;
  handle->access = access;
  handle->pid = ::getpid();
  handle->host_identity = platform::host_identity();
  handle->transports = transports_of_this_proc(registration->nic != nullptr, device);
  handle->nic_address = registration->nic_address;
  handle->rkey = registration->rkey;
  if (!device) handle->one_sided = rdma::one_sided_publish(*registration);
  handle->device = view.device();
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
    rdma::one_sided_retire(released);
    rdma::IbverbsPath::instance().retire(released, host.get());
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
  transfer->owner = handle_->owner;
  transfer->buffer = handle_->id;
  transfer->release = true;
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
