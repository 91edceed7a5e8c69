// Making a group's device communicator (comm_for, device_comm.h): every rank
// checks what can fail on it alone, the ranks exchange their checks and the
// backend's unique id through a host allgather that cannot hang, and every
// rank takes the same decision before the backend's collective init.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/device_comm.h"
#include "core/progress/request_state.h"

namespace castmesh::detail {
namespace {

// What every rank tells the others when the device communicator is made.
struct InitRecord {
  int32_t kind = -1;  // DeviceKind of this rank's buffers, -1 when its checks failed
  int32_t index = 0;
  int32_t status = CASTMESH_STATUS_OK;  // rank 0: making the id; others: OK
  int32_t checked = 1;                  // 0: this rank's arguments were refused
  castmesh_te_unique_id_v1 id{};
  char message[256] = {};
};

void set_message(InitRecord& record, absl::string_view text) {
  const size_t n = std::min(text.size(), sizeof(record.message) - 1);
  std::memcpy(record.message, text.data(), n);
  record.message[n] = '\0';
}

// Two ranks of one process on one device: NCCL/RCCL refuse that at
// comm_create on some ranks only ("duplicate GPU"), which would leave the
// others waiting there; every rank sees the same records and refuses here.
absl::Status check_devices(const CommGroup& group, const std::vector<InitRecord>& all) {
  const std::vector<ProcId>& procs = group.layout().procs;
  for (size_t a = 0; a < all.size(); ++a) {
    for (size_t b = a + 1; b < all.size(); ++b) {
      if (procs[a] != procs[b] || all[a].kind != all[b].kind || all[a].index != all[b].index) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks ", a, " and ", b, " of communicator ", group.id(), " run in the same process on ",
          Device{static_cast<DeviceKind>(all[a].kind), all[a].index}.to_string(),
          ": NCCL/RCCL need one device per rank; give each rank its own device"));
    }
  }
  return absl::OkStatus();
}

// Every rank's InitRecord, through a host allgather that cannot hang: it runs
// on a thread of its own and is given up after `timeout`. It is the host part
// of device collective `call` (its number and its signature: a rank that
// called something else meets it as a mismatched collective). Ranks that passed
// host buffers to this collective run a host algorithm with the same number
// instead; some of them may never send what this rank waits for. On a failure
// or the timeout the collective is aborted on every rank, which also ends the
// host algorithm's receives on the ranks that wait for this one.
absl::StatusOr<std::vector<InitRecord>> exchange_records(CommGroup& group, const InitRecord& mine,
                                                         absl::Duration timeout, uint64_t sequence,
                                                         const std::string& signature) {
  struct Exchanged {
    InitRecord mine;
    std::vector<InitRecord> all;
  };
  auto buffers = std::make_shared<Exchanged>(Exchanged{mine, std::vector<InitRecord>(group.size())});
  const collectives::CollectiveCall call{&group, sequence, std::make_shared<const std::string>(signature)};
  Request request = group.run_async([call, buffers] {
    return collectives::run_allgather(call, &buffers->mine, buffers->all.data(), sizeof(InitRecord));
  });
  absl::StatusOr<MessageStatus> done = request.wait(timeout);
  absl::Status st = done.status();
  if (absl::IsDeadlineExceeded(st)) {
    st = absl::DeadlineExceededError(absl::StrCat(
        "the first device collective of communicator ", group.id(), " did not meet every rank within ",
        absl::FormatDuration(timeout),
        " (DeviceOptions.timeout): a rank passed host buffers, called another collective, or hung"));
  } else if (absl::IsFailedPrecondition(st) && absl::StrContains(st.message(), "mismatched collective")) {
    st = absl::InvalidArgumentError(absl::StrCat("the first device collective of communicator ", group.id(),
                                                 " met a rank that called something else: ",
                                                 st.message()));
  }
  if (!st.ok()) {
    group.abort(call.sequence, st);
    // The exchange's receives end with the abort; wait for its thread so no
    // late byte lands after this returns (it owns its buffers regardless).
    (void)request.wait(absl::InfiniteDuration());
    return st;
  }
  return std::move(buffers->all);
}

// Whether this process's collective library (NCCL/RCCL) loads: an empty
// group, which makes the backend load it and enqueues nothing.
int32_t probe_collectives(const castmesh_tensor_engine_table_v1& table, castmesh_error_v1* error) {
  const int32_t code = table.group_begin(error);
  if (code != CASTMESH_STATUS_OK) return code;
  return table.group_end(error);
}

absl::StatusOr<std::shared_ptr<DeviceComm>> make_comm(CommGroup& group, const DeviceEngine* engine, Device device,
                                                      const absl::Status& checked, absl::Duration timeout,
                                                      uint64_t sequence, const std::string& what) {
  const castmesh_tensor_engine_table_v1& table = *engine->table;
  InitRecord mine;
  if (checked.ok()) {
    mine.kind = static_cast<int32_t>(device.kind);
    mine.index = device.index;
  } else {
    mine.checked = 0;
    set_message(mine, checked.message());
  }
  castmesh_error_v1 error{};
  // Everything that can fail on one rank alone happens before the exchange,
  // and its outcome travels in it: once a rank is inside comm_create it
  // waits there for every other rank. Rank 0 makes the id; the others check
  // that their collective library loads (an empty group: making an id would
  // start an NCCL bootstrap root that nobody joins).
  absl::StatusOr<DeviceStream> own = absl::FailedPreconditionError("not made");
  if (checked.ok()) {
    mine.status = group.rank() == 0 ? table.comm_unique_id(&mine.id, &error) : probe_collectives(table, &error);
    if (mine.status != CASTMESH_STATUS_OK) set_message(mine, error.message);
  }
  if (checked.ok() && mine.status == CASTMESH_STATUS_OK) {
    own = DeviceStream::Create(device);
    if (!own.ok()) {
      mine.status = CASTMESH_STATUS_INTERNAL;
      set_message(mine, own.status().message());
    }
  }
  absl::StatusOr<std::vector<InitRecord>> exchanged = exchange_records(group, mine, timeout, sequence, what);
  if (!exchanged.ok()) return exchanged.status();
  const std::vector<InitRecord>& all = *exchanged;
  // Every rank saw the same records, so every rank takes the same decision.
  if (!checked.ok()) return checked;  // this rank's own reason
  for (int r = 0; r < group.size(); ++r) {
    if (all[r].checked == 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " refused its arguments: ", all[r].message));
    }
  }
  for (int r = 0; r < group.size(); ++r) {
    if (all[r].status == CASTMESH_STATUS_OK) continue;
    return backend_status(all[r].status, castmesh_error_v1{all[r].status, {}},
                          absl::StrCat("rank ", r, " cannot join the device communicator: ", all[r].message));
  }
  if (absl::Status st = check_devices(group, all); !st.ok()) return st;
  for (int r = 1; r < group.size(); ++r) {
    if (all[r].kind != all[0].kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks hold their buffers on different kinds of device: rank 0 on ",
          Device{static_cast<DeviceKind>(all[0].kind), all[0].index}.to_string(), ", rank ", r, " on ",
          Device{static_cast<DeviceKind>(all[r].kind), all[r].index}.to_string(), "; use one kind on every rank"));
    }
  }
  const std::string name = absl::StrCat("communicator ", group.id(), " (rank ", group.rank(), ")");
  castmesh_te_comm_v1* comm = nullptr;
  // The library's init is collective (it returns once every rank joined).
  const absl::Status created = run_handing_worker_on([&] {
    return backend_status(table.comm_create(device.index, &all[0].id, group.size(), group.rank(), &comm, &error),
                          error, absl::StrCat("comm_create for ", name));
  });
  if (!created.ok()) return created;
  return std::make_shared<DeviceComm>(engine, device, name, comm, *std::move(own));
}
}  // namespace

// The group's device communicator on `device`, made at the first call
// (collective: every rank calls it at the same point; `checked` is this
// rank's argument check, shared so a refused call fails on every rank).
absl::StatusOr<std::shared_ptr<DeviceComm>> comm_for(CommGroup& group, const DeviceEngine* engine, Device device,
                                                     const absl::Status& checked, absl::Duration timeout,
                                                     const DeviceCall& call, const std::string& what) {
  std::shared_ptr<DeviceRegistry::Slot> slot = DeviceRegistry::get().slot(group);
  MutexLock lock(slot->mu);
  if (slot->comm != nullptr) {
    if (!checked.ok()) return checked;
    if (slot->comm->device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this rank's device collectives of communicator ", group.id(), " run on ", slot->comm->device().to_string(),
          " but the buffers are on ", device.to_string(),
          ": a communicator uses one device per rank (stage through the host, or use another communicator)"));
    }
    return slot->comm;
  }
  absl::StatusOr<std::shared_ptr<DeviceComm>> made = make_comm(group, engine, device, checked, timeout, call.sequence, what);
  if (!made.ok()) return made.status();
  slot->comm = *made;
  return slot->comm;
}

}  // namespace castmesh::detail
