"""Which castmesh communicator ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` are.

Inside an endpoint of an actor mesh, COMM_WORLD is the mesh's communicator
(``collectives.current()``), looked up on every call since one worker
process may run several actors. Elsewhere it is the SPMD world
(``collectives.world()``): rank and size from the launcher's variables
(mpirun, srun, ...; rank 0 is the rendezvous, docs/collectives.md). A
program started without a launcher is a world of one process, as MPI's
singleton init; it gets a private rendezvous address and secret so that
such processes never meet each other. COMM_SELF is the calling rank alone
(``along([])``: no messages exchanged).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any, Dict, Optional

from .. import _castmesh, _context
from . import errors

# The variables a launcher sets for the rank (castmesh's own first; see docs/procs.md).
_RANK_VARIABLES = ("CASTMESH_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX")

_lock = threading.Lock()
_spmd: Optional[Any] = None


class _Cached(threading.local):
    # Class defaults: reading them on a thread that set none raises nothing.
    ctx: Any = None
    impl: Any = None


_local = _Cached()
_selves: Dict[int, Any] = {}
_aux: Dict[int, Any] = {}


def _join_spmd_world() -> Any:
    """collectives.world() under a launcher; a one-process world (singleton init) without one."""
    timeout = float(os.environ.get("CASTMESH_JOIN_TIMEOUT", "60"))
    if any(os.environ.get(name) for name in _RANK_VARIABLES):
        return _castmesh.world_communicator("", "", timeout)
    saved = {name: os.environ.get(name) for name in ("CASTMESH_RANK", "CASTMESH_WORLD_SIZE")}
    os.environ["CASTMESH_RANK"] = "0"
    os.environ["CASTMESH_WORLD_SIZE"] = "1"
    try:
        # A free loopback port: private to this process and portable (abstract
        # Unix names exist only on Linux).
        return _castmesh.world_communicator("tcp:127.0.0.1:0", secrets.token_hex(16), timeout)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def world_impl() -> Any:
    """The castmesh communicator COMM_WORLD stands for on the calling thread."""
    ctx = _context.current()
    if ctx is not None:
        if _local.ctx is ctx:
            return _local.impl
        impl = _castmesh.current_communicator()
        _local.ctx, _local.impl = ctx, impl
        return impl
    global _spmd
    if _spmd is not None:
        return _spmd
    if _context.in_worker():
        raise errors.Exception(errors.ERR_COMM, "MPI.COMM_WORLD in a castmesh worker process is the mesh's "
                               "communicator, usable only inside an actor's endpoint")
    with _lock:
        if _spmd is None:
            _spmd = _join_spmd_world()
    return _spmd


def self_impl() -> Any:
    """The calling rank alone, from whichever communicator COMM_WORLD is here."""
    world = world_impl()
    key = world.id
    impl = _selves.get(key)
    if impl is None:
        impl = _selves[key] = world.along([])
    return impl


def aux_of(impl: Any) -> Any:
    """A duplicate of ``impl`` for the messages this layer exchanges inside collectives (Gatherv,
    pickled gather, ...), so they never match the program's own sends. Made (collectively) at the
    first collective that needs it, which every rank reaches in the same order."""
    key = impl.id
    aux = _aux.get(key)
    if aux is None:
        aux = _aux[key] = impl.dup()
    return aux
