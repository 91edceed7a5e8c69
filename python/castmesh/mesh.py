"""Meshes of procs and actors: the names castmesh.mesh has always offered.

The code lives by concept: actor meshes and their endpoints in
castmesh.actor_mesh, proc meshes in castmesh.proc_mesh, hosts in
castmesh.host_mesh, the controller runtime in castmesh._runtime. This module
keeps every name importable from ``castmesh.mesh``.
"""

from __future__ import annotations

from .actor_mesh import Accumulator, ActorMesh, Endpoint, EndpointRef, NotAnEndpoint, ResultStream, as_endpoint
from .host_mesh import HostMesh, this_host
from .proc_mesh import ProcMesh, Rendezvous, rendezvous_proc_mesh, this_proc

__all__ = ["ProcMesh", "ActorMesh", "EndpointRef", "Endpoint", "Accumulator", "as_endpoint", "ResultStream",
           "Rendezvous", "rendezvous_proc_mesh", "this_host", "this_proc", "HostMesh", "NotAnEndpoint"]
