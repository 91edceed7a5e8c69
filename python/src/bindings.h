// Pieces of the castmesh._castmesh extension module. Each binding file defines
// one bind_<area>(module) function, declared here and called from module.cc,
// so areas add their bindings without touching each other's files.
#pragma once

#include <pybind11/pybind11.h>

#include "castmesh/runtime.h"

namespace castmesh::python {

// Whether a castmesh thread may still take the GIL: false once the
// interpreter has begun to exit (the atexit hook registered at import has
// run; castmesh's own exit hooks, which stop the runtime, run before it).
// A thread that takes the GIL after finalization has begun is ended by
// pthread_exit, which aborts the process when it unwinds through a noexcept
// frame (any destructor): callers leak Python objects instead. Any thread.
bool python_usable();

// castmesh.backends(), castmesh.load_backend(), BackendInfo, DeviceInfo.
void bind_backends(pybind11::module_& module);
// Shape (castmesh.Shape's algebra).
void bind_shape(pybind11::module_& module);
// castmesh.Tensor, as_tensor, allocate_tensor (tensor_binding.cc; helpers for
// other bindings in tensor_binding.h).
void bind_tensor(pybind11::module_& module);
// Communicator, Request, current_communicator, world_communicator
// (castmesh.collectives wraps them).
void bind_collectives(pybind11::module_& module);
// RdmaHandle, RdmaPending, rdma_submit_batch (castmesh.rdma wraps them).
void bind_rdma(pybind11::module_& module);
// tensor_engine_binding.cc: device streams, memory and copies (castmesh.tensor_engine).
void bind_tensor_engine(pybind11::module_& module);
// CallFuture, MeshCallFuture: pending results of calls (call_slot.cc).
void bind_call_slots(pybind11::module_& module);
// ActorRef: one Python actor server (actor_server.cc).
void bind_actor_server(pybind11::module_& module);
// ProcMesh, ActorMesh, ReplyStream: meshes of Python actor servers (mesh_binding.cc).
void bind_meshes(pybind11::module_& module);
// Runtime, spawn_in_this_proc, run_worker: this process's runtime (runtime_binding.cc).
void bind_runtime(pybind11::module_& module);
// Host agents and host meshes (host_binding.cc).
void bind_hosts(pybind11::module_& module);
// Output forwarding of procs (output_binding.cc).
void bind_output(pybind11::module_& module);
// castmesh.trace: traces of message flow and user spans (trace_binding.cc).
void bind_trace(pybind11::module_& module);
// Stack dumps of procs, castmesh.debug (debug_binding.cc).
void bind_debug(pybind11::module_& module);
// metrics_binding.cc: castmesh.metrics snapshots, user meters, observers.
void bind_metrics(pybind11::module_& module);
// Channel, open_channel, port_send: castmesh.Channel's ports (channel_binding.cc).
void bind_channels(pybind11::module_& module);
// watch_failures, next_failure, watch_stopped: castmesh.supervision's monitors (supervision_binding.cc).
void bind_supervision(pybind11::module_& module);
// config_*: the settings table behind castmesh.config (config_binding.cc).
void bind_config(pybind11::module_& module);

// The runtime of the calling process (the controller's or the worker's);
// raises RuntimeError where there is none. Python thread.
Runtime& current_runtime();

}  // namespace castmesh::python
