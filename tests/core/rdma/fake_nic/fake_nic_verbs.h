// A FAKE cross-process libibverbs provider: what the FAKE rdma plugin of
// tests/core/rdma/fake_nic binds the rdma backend's logic to, so RdmaBuffer's
// ibverbs transport runs between real processes on a machine without a NIC.
//
// One fake RoCE device ("fake_nic0", port 1, active). A fake QP connected to a
// peer's QP moves the bytes of a posted READ/WRITE between the two PROCESSES
// with process_vm_readv/process_vm_writev, after the checks a NIC makes (local
// key and range, the peer QP connected back to this one, the remote key,
// range and access). The peer is found through its GID, which this fake fills
// with "FAKE", the process id and the address of the process's exported
// table of registrations and QPs (read by peers with process_vm_readv).
//
// Posted work requests run when the CQ is polled, once
// CASTMESH_FAKE_NIC_DELAY_MS (read at post time; default 0) has passed: a
// slow NIC, so tests can time an operation out while the fake NIC still owes
// its bytes. A destroyed QP never runs what it still holds.
#pragma once

#include "rdma_verbs_ops.h"

namespace castmesh::fake_nic {

// The ops table of the fake provider (process-wide state).
const rdma_verbs_ops* ops();

}  // namespace castmesh::fake_nic
