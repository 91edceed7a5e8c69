// Everything a castmesh user needs, in one include: actors and their refs,
// ports and futures; actor, proc and host meshes; the communicator and the
// data plane's tensors and reductions; device memory (tensor_engine) and RDMA
// buffers; configuration, backends, traces and proc output.
// tests/include/castmesh_h_test.cc builds a program that includes only this
// header and uses each area.
//
// Not included: castmesh/backend_abi.h (the C ABI backend plugins implement,
// docs/plugins.md; castmesh/backend.h brings what users of backends need) and
// castmesh/detail/ (visible only because templates need it).
#pragma once

// Actors, refs, ports, futures, messages, supervision and the runtime.
#include "castmesh/actor.h"
#include "castmesh/address.h"
#include "castmesh/future.h"
#include "castmesh/message.h"
#include "castmesh/port.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/supervision.h"

// Meshes: shapes, actor meshes and their replies, procs and hosts.
#include "castmesh/actor_mesh.h"
#include "castmesh/cast_tree.h"
#include "castmesh/host_mesh.h"
#include "castmesh/mesh_options.h"
#include "castmesh/output.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/shape.h"
#include "castmesh/value_mesh.h"

// The data plane: tensors, reductions, the communicator, device memory, RDMA.
#include "castmesh/communicator.h"
#include "castmesh/dlpack.h"
#include "castmesh/dtype.h"
#include "castmesh/rdma.h"
#include "castmesh/reduce_op.h"
#include "castmesh/reduction.h"
#include "castmesh/tensor.h"
#include "castmesh/tensor_engine.h"

// Settings, backends, traces, metrics and the version.
#include "castmesh/backend.h"
#include "castmesh/config.h"
#include "castmesh/metrics.h"
#include "castmesh/trace.h"
#include "castmesh/version.h"
