"""mpi4py's ``MPI`` module over castmesh's Communicator: ``from castmesh import MPI``.

Programs written for mpi4py run by changing ``from mpi4py import MPI`` to
``from castmesh import MPI``. Under a launcher (``mpirun -n 4 python
prog.py``, ``srun``) ``MPI.COMM_WORLD`` is ``castmesh.collectives.world()``
(rank 0 is the rendezvous; no extra variables on one host); inside an
actor's endpoint it is the mesh's communicator; a program started alone is
a world of one. Provided: buffer specs and the upper-case buffer methods,
the lower-case pickle methods, requests (also persistent), Status, ops
(MAXLOC/MINLOC, ``Op.Create``), predefined and derived datatypes, and the
usual constants. What is not (dynamic processes, RMA windows, I/O, groups,
topologies, ...) raises NotImplementedError naming the call. See
docs/mpi4py.md.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Tuple

from . import __version__ as _castmesh_version
from ._mpi import errors as _errors
from ._mpi import world as _world
from ._mpi.buffers import BOTTOM, IN_PLACE
from ._mpi.comm import COMM_NULL, Comm, Intracomm
from ._mpi.constants import *  # noqa: F401,F403 - MPI's integer constants
from ._mpi.constants import THREAD_MULTIPLE, TAG_UB_VALUE  # noqa: F401
from ._mpi.datatypes import *  # noqa: F401,F403 - the predefined datatypes
from ._mpi.datatypes import Datatype
from ._mpi.errors import *  # noqa: F401,F403 - error classes
from ._mpi.errors import Exception, Get_error_class, Get_error_string  # noqa: A004
from ._mpi.ops import (BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL, PROD, REPLACE, SUM,
                       Op)
from ._mpi.p2p import attached as _attached
from ._mpi.requests import REQUEST_NULL, Prequest, Request
from ._mpi.status import Status

COMM_WORLD = Intracomm._of(_world.world_impl, "MPI_COMM_WORLD")
COMM_SELF = Intracomm._of(_world.self_impl, "MPI_COMM_SELF")

_START = time.perf_counter()


def Wtime() -> float:  # noqa: N802
    """Seconds on a monotonic high-resolution clock (MPI_Wtime)."""
    return time.perf_counter()


def Wtick() -> float:  # noqa: N802
    """The resolution of ``Wtime()`` in seconds (MPI_Wtick)."""
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:  # noqa: N802
    """This machine's host name (MPI_Get_processor_name)."""
    return socket.gethostname()


def Get_version() -> Tuple[int, int]:  # noqa: N802
    """The MPI standard version whose semantics this follows (3.1)."""
    return (3, 1)


def Get_library_version() -> str:  # noqa: N802
    """castmesh's version, naming castmesh.MPI as the library (MPI_Get_library_version)."""
    return f"castmesh {_castmesh_version} (castmesh.MPI, mpi4py-compatible)"


def Init() -> None:  # noqa: N802
    """Nothing to do: COMM_WORLD joins its peers at its first use."""


def Init_thread(required: int = THREAD_MULTIPLE) -> int:  # noqa: N802
    """Nothing to start; returns the thread level provided, always THREAD_MULTIPLE."""
    del required
    return THREAD_MULTIPLE


def Finalize() -> None:  # noqa: N802
    """Nothing to do: the world's ranks meet in a barrier at exit (docs/collectives.md)."""


def Is_initialized() -> bool:  # noqa: N802
    """Always True: there is nothing to initialise."""
    return True


def Is_finalized() -> bool:  # noqa: N802
    """Always False: Finalize() ends nothing."""
    return False


def Query_thread() -> int:  # noqa: N802
    """castmesh's communicators are thread-safe: THREAD_MULTIPLE."""
    return THREAD_MULTIPLE


def Is_thread_main() -> bool:  # noqa: N802
    """True on the Python main thread."""
    import threading  # noqa: PLC0415
    return threading.current_thread() is threading.main_thread()


def Attach_buffer(buf: Any) -> None:  # noqa: N802
    """The buffer Bsend copies messages into (its size bounds the messages in flight)."""
    _attached.attach(buf)


def Detach_buffer() -> Any:  # noqa: N802
    """Waits for the buffered messages to leave and returns the attached buffer."""
    return _attached.detach()


def Pcontrol(level: int) -> None:  # noqa: N802
    """Profiling control (MPI_Pcontrol): accepted and ignored; castmesh.trace records traces."""
    del level


def __getattr__(name: str) -> Any:
    """Any other mpi4py name is not provided here: NotImplementedError naming it, never AttributeError."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"castmesh.MPI.{name} is not provided (dynamic processes, RMA windows, I/O, groups and "
                              "topologies are not; see docs/mpi4py.md)")


del Any, Tuple, annotations
