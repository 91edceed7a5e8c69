"""``MPI.Comm`` / ``MPI.Intracomm``: a castmesh communicator with mpi4py's methods.

A Comm holds a function returning its castmesh communicator: a constant
for communicators made by Split/Dup, a lookup for COMM_WORLD/COMM_SELF
(world.py), since inside actors they depend on the calling endpoint.
``Intracomm(comm)`` makes another handle of the same communicator (what
mpi4py does, and what subclasses such as mpi4py's reductions demo rely on).
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Optional

from . import errors
from .collective import Collectives
from .constants import APPNUM, HOST, IDENT, IO, PROC_NULL, TAG_UB, TAG_UB_VALUE, UNDEFINED, UNEQUAL, UNIVERSE_SIZE, \
    WTIME_IS_GLOBAL
from .datatypes import Unavailable
from .objects import Objects
from .p2p import PointToPoint


def _constant(impl: Any) -> Callable[[], Any]:
    return itertools.repeat(impl).__next__


def _null() -> Any:
    raise errors.Exception(errors.ERR_COMM, "invalid communicator (MPI.COMM_NULL, or freed)")


class Comm(PointToPoint, Collectives, Objects, Unavailable):
    """``MPI.Comm``."""

    def __new__(cls, comm: Optional["Comm"] = None) -> "Comm":
        self = object.__new__(cls)
        if comm is None:
            self._get = _null
            self._name = ""
        else:
            self._get = comm._get
            self._name = comm._name
        return self

    def __init__(self, comm: Optional["Comm"] = None) -> None:
        pass

    @classmethod
    def _of(cls, get: Callable[[], Any], name: str = "") -> "Comm":
        c = cls.__new__(cls)
        c._get = get
        c._name = name
        return c

    # ---- identity ----
    def Get_rank(self) -> int:  # noqa: N802
        return self._get().rank

    def Get_size(self) -> int:  # noqa: N802
        return self._get().size

    @property
    def rank(self) -> int:
        return self._get().rank

    @property
    def size(self) -> int:
        return self._get().size

    @property
    def name(self) -> str:
        return self._name

    def Get_name(self) -> str:  # noqa: N802
        return self._name

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._name = str(name)

    def Is_inter(self) -> bool:  # noqa: N802
        return False

    def Is_intra(self) -> bool:  # noqa: N802
        return True

    @property
    def is_inter(self) -> bool:
        return False

    @property
    def is_intra(self) -> bool:
        return True

    def Get_topology(self) -> int:  # noqa: N802
        return UNDEFINED

    @property
    def topology(self) -> int:
        return UNDEFINED

    def __bool__(self) -> bool:
        return self._get is not _null

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        if self._get is _null or other._get is _null:
            return self._get is other._get
        return self._get is other._get or self._get().id == other._get().id

    def __hash__(self) -> int:
        return id(self._get)

    def __repr__(self) -> str:
        if self._get is _null:
            return "<castmesh.MPI.Intracomm COMM_NULL>"
        return f"<castmesh.MPI.{type(self).__name__} {self._name or ''} rank={self.rank} size={self.size}>"

    def Compare(self, comm: "Comm") -> int:  # noqa: N802
        return IDENT if self == comm else UNEQUAL

    def Get_attr(self, keyval: int) -> Any:  # noqa: N802
        """TAG_UB, HOST, IO, WTIME_IS_GLOBAL, APPNUM, UNIVERSE_SIZE (others: None, as an unset attribute)."""
        if keyval == TAG_UB:
            return TAG_UB_VALUE
        if keyval == HOST:
            return PROC_NULL
        if keyval == IO:
            return self.rank
        if keyval == WTIME_IS_GLOBAL:
            return 0
        if keyval == APPNUM:
            return None
        if keyval == UNIVERSE_SIZE:
            return self.size
        return None

    # ---- making and freeing communicators ----
    def Dup(self, info: Any = None) -> "Intracomm":  # noqa: N802
        del info
        return Intracomm._of(_constant(self._get().dup()), self._name)

    Clone = Dup

    def Split(self, color: int = 0, key: int = 0) -> "Intracomm":  # noqa: N802
        sub = self._get().split(UNDEFINED if color == UNDEFINED else int(color), int(key))
        return COMM_NULL if sub is None else Intracomm._of(_constant(sub))

    def Free(self) -> None:  # noqa: N802
        if self._get is _null:
            raise errors.Exception(errors.ERR_COMM, "Free of MPI.COMM_NULL")
        self._get = _null

    def Disconnect(self) -> None:  # noqa: N802
        self.Free()

    def Abort(self, errorcode: int = 0) -> None:  # noqa: N802
        """Ends this process at once with ``errorcode`` (the launcher then ends the others, as mpirun does)."""
        import sys  # noqa: PLC0415
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(errorcode) if errorcode else 1)

    # MPI-4.1 communicator buffers share the process's attached buffer here.
    def py2f(self) -> int:
        return id(self)


class Intracomm(Comm):
    """``MPI.Intracomm``: every communicator here is an intra-communicator."""


COMM_NULL = Intracomm()
