// Device collectives (device_collectives.h): each Communicator call on device
// buffers checks its arguments (device_checks.h), takes the collective number
// and announces it, gets the group's device communicator (device_comm.h) and
// enqueues the backend's calls on it.
#include "core/collectives/device_collectives.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/device_checks.h"
#include "core/collectives/device_comm.h"
#include "core/progress/request_state.h"

namespace castmesh::collectives {
namespace {

using detail::DeviceComm;
using detail::DeviceEngine;

// Takes the collective's number and announces it: posts the receive of the
// previous rank's descriptor and sends this rank's to the next rank (empty
// messages whose signature is `what`; neither is waited for here), so a rank
// that called something else at that number finds out without a round trip.
detail::DeviceCall announce(detail::CommGroup& group, const std::string& what) {
  detail::DeviceCall call{group.weak_from_this(), group.next_sequence(), nullptr};
  const int n = group.size();
  if (n == 1) return call;
  static const char kNoBody = 0;
  const int64_t tag = collective_tag(call.sequence, kDescriptorStep);
  call.descriptor = group.post_recv(Channel::kCollective, (group.rank() + n - 1) % n, tag, nullptr, 0,
                                    std::make_shared<const std::string>(what));
  (void)group.start_send(Channel::kCollective, (group.rank() + 1) % n, tag, &kNoBody, 0, what, call.sequence);
  return call;
}

// One device collective: its number and descriptors, the engine, this rank's
// check, the communicator (made at the first call with every rank's check),
// then the enqueue. A failure here fails the collective on every rank.
Request run(detail::CommGroup& group, std::string what, const Device& device, absl::Status checked,
            std::vector<TensorView> keep, const DeviceOptions& options, const DeviceComm::Enqueue& enqueue) {
  detail::DeviceCall call = announce(group, what);
  absl::StatusOr<const DeviceEngine*> engine = detail::device_engine_for(device, what);
  if (!engine.ok()) return detail::given_up(call, engine.status());
  if (checked.ok() && options.timeout <= absl::ZeroDuration()) {
    checked = absl::InvalidArgumentError("DeviceOptions.timeout must be positive");
  }
  const absl::Duration timeout = options.timeout > absl::ZeroDuration() ? options.timeout : absl::Seconds(1);
  absl::StatusOr<std::shared_ptr<DeviceComm>> comm =
      detail::comm_for(group, *engine, device, checked, timeout, call, what);
  if (!comm.ok()) {
    return detail::given_up(call,
                            absl::Status(comm.status().code(), absl::StrCat(what, ": ", comm.status().message())));
  }
  return (*comm)->launch(std::move(what), std::move(keep), options, enqueue, std::move(call));
}


char* at(const TensorView& t, size_t offset) { return static_cast<char*>(t.data()) + offset; }

// Runs the calls of `body` as one backend group (group_end always called).
int32_t grouped(const castmesh_tensor_engine_table_v1& table, castmesh_error_v1* error,
                const std::function<int32_t()>& body) {
  int32_t code = table.group_begin(error);
  if (code != CASTMESH_STATUS_OK) return code;
  code = body();
  castmesh_error_v1 end_error{};
  const int32_t end = table.group_end(&end_error);
  if (code == CASTMESH_STATUS_OK && end != CASTMESH_STATUS_OK) {
    *error = end_error;
    code = end;
  }
  return code;
}

const castmesh_tensor_engine_table_v1* table_for(const Device& device) {
  absl::StatusOr<const DeviceEngine*> engine = detail::device_engine_for(device, "device collective");
  return engine.ok() ? (*engine)->table : nullptr;
}

}  // namespace

bool on_device(const TensorView& a, const TensorView& b) {
  return detail::is_engine_device(a.device()) || detail::is_engine_device(b.device());
}

absl::Status host_only(const TensorView& t, absl::string_view what, absl::string_view op) {
  return absl::UnimplementedError(
      absl::StrCat(what, " lives on ", t.device().to_string(), ": ", op,
                   " runs on host memory only (NCCL/RCCL have no tags, any-source or probe); ", kStageHint));
}

Request device_allreduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                         const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(in.numel());
  return run(
      group, describe("allreduce", op.name(), in), device, checked, {in, out}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->allreduce(c, in.data(), out.data(), n, dtype, reduce, s, e);
      });
}

Request device_reduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                      int root, const DeviceOptions& options) {
  // The ABI has no reduce: every rank allreduces, non-roots into scratch.
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_root(root, group.size());
  if (checked.ok() && group.rank() == root) {
    checked = check_device_buffer(out, "output", device, true);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  }
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  TensorView target = out;
  if (checked.ok() && group.rank() != root) {
    absl::StatusOr<TensorView> scratch = device_empty(in.dtype(), {in.numel()}, device);
    if (scratch.ok())
      target = *scratch;
    else
      checked = scratch.status();
  }
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(in.numel());
  return run(
      group, describe("reduce", op.name(), in, root), device, checked, {in, target}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->allreduce(c, in.data(), target.data(), n, dtype, reduce, s, e);
      });
}

Request device_broadcast(detail::CommGroup& group, const TensorView& data, int root, const DeviceOptions& options) {
  const Device device = data.device();
  absl::Status checked = check_device_buffer(data, "buffer", device, group.rank() != root);
  if (checked.ok()) checked = check_root(root, group.size());
  return run(group, describe("broadcast", "", data, root), device, checked, {data}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               return table_for(device)->broadcast(c, data.data(), data.data(), data.nbytes(), CASTMESH_TE_DTYPE_UINT8,
                                                   root, s, e);
             });
}

Request device_allgather(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                         const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()) * group.size());
  return run(group, describe("allgather", "", in), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               return table_for(device)->allgather(c, in.data(), out.data(), in.nbytes(), CASTMESH_TE_DTYPE_UINT8, s,
                                                   e);
             });
}

Request device_reduce_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                              const ReduceSpec& op, const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(in, "input", static_cast<size_t>(out.numel()) * group.size());
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(out.numel());
  return run(
      group, describe("reduce_scatter", op.name(), out), device, checked, {in, out}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->reduce_scatter(c, in.data(), out.data(), n, dtype, reduce, s, e);
      });
}

Request device_gather(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                      const DeviceOptions& options) {
  const Device device = in.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_root(root, size);
  if (checked.ok() && rank == root) {
    checked = check_device_buffer(out, "output", device, true);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()) * size);
  }
  const size_t bytes = in.nbytes();
  return run(group, describe("gather", "", in, root), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               return grouped(t, e, [&]() -> int32_t {
                 if (rank != root) return t.send(c, in.data(), bytes, CASTMESH_TE_DTYPE_UINT8, root, s, e);
                 for (int r = 0; r < size; ++r) {
                   int32_t code = r == rank ? (at(out, bytes * r) == in.data() || bytes == 0
                                                   ? int32_t{CASTMESH_STATUS_OK}
                                                   : t.copy(at(out, bytes * r), in.data(), bytes,
                                                            CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e))
                                            : t.recv(c, at(out, bytes * r), bytes, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

Request device_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                       const DeviceOptions& options) {
  const Device device = out.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(out, "output", device, true);
  if (checked.ok()) checked = check_root(root, size);
  if (checked.ok() && rank == root) {
    checked = check_device_buffer(in, "input", device, false);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(in, "input", static_cast<size_t>(out.numel()) * size);
  }
  const size_t bytes = out.nbytes();
  return run(group, describe("scatter", "", out, root), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               return grouped(t, e, [&]() -> int32_t {
                 if (rank != root) return t.recv(c, out.data(), bytes, CASTMESH_TE_DTYPE_UINT8, root, s, e);
                 for (int r = 0; r < size; ++r) {
                   int32_t code = r == rank ? (at(in, bytes * r) == out.data() || bytes == 0
                                                   ? int32_t{CASTMESH_STATUS_OK}
                                                   : t.copy(out.data(), at(in, bytes * r), bytes,
                                                            CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e))
                                            : t.send(c, at(in, bytes * r), bytes, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

Request device_alltoall(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                        const DeviceOptions& options) {
  const Device device = in.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  if (checked.ok() && in.numel() % size != 0) {
    checked = absl::InvalidArgumentError(
        absl::StrCat("alltoall input of ", in.numel(), " elements is not divisible into ", size, " blocks"));
  }
  // In place: the blocks are sent from a copy, made first on the stream.
  TensorView source = in;
  if (checked.ok() && in.data() == out.data() && in.numel() > 0) {
    absl::StatusOr<TensorView> scratch = device_empty(in.dtype(), {in.numel()}, device);
    if (scratch.ok())
      source = *scratch;
    else
      checked = scratch.status();
  }
  const size_t block = checked.ok() ? in.nbytes() / size : 0;
  return run(group, describe("alltoall", "", in), device, checked, {in, out, source}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               if (source.data() != in.data()) {
                 int32_t code = t.copy(source.data(), in.data(), in.nbytes(), CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e);
                 if (code != CASTMESH_STATUS_OK) return code;
               }
               if (block == 0) return int32_t{CASTMESH_STATUS_OK};
               return grouped(t, e, [&]() -> int32_t {
                 for (int r = 0; r < size; ++r) {
                   int32_t code = CASTMESH_STATUS_OK;
                   if (r == rank) {
                     code = t.copy(at(out, block * r), at(source, block * r), block, CASTMESH_TE_COPY_DEVICE_TO_DEVICE,
                                   s, e);
                   } else {
                     code = t.send(c, at(source, block * r), block, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                     if (code == CASTMESH_STATUS_OK) {
                       code = t.recv(c, at(out, block * r), block, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                     }
                   }
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

}  // namespace collectives
