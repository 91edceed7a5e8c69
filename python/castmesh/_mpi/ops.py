"""Reduction operations: ``MPI.SUM`` ... ``MPI.MAXLOC``/``MINLOC`` and ``Op.Create``.

An Op combines buffers (NumPy arrays of a datatype's elements, ``invec``
holding the lower ranks' data, MPI's ``inoutvec = invec op inoutvec``) and,
called as ``op(x, y)``, Python objects (mpi4py's lower-case methods).
Built-in ops on castmesh's dtypes run in the C++ Communicator (``native``
names castmesh's op); the rest are combined here in rank order.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

import numpy as np

from . import errors
from .datatypes import Datatype, Unavailable


def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def combine(x: Any, y: Any) -> Any:
        (u, i), (v, j) = x, y
        if better(u, v):
            return (u, i)
        if better(v, u):
            return (v, j)
        return (u, min(i, j))
    return combine


def _loc_arrays(better: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = b.copy()
        take_a = better(a["v"], b["v"]) | ((a["v"] == b["v"]) & (a["i"] < b["i"]))
        out[take_a] = a[take_a]
        return out
    return combine


class Op(Unavailable):
    """``MPI.Op``: a predefined or user-defined reduction."""

    __slots__ = ("_name", "native", "_objects", "_arrays", "_user", "_commute", "_freed")

    def __init__(self, name: str = "", native: Optional[str] = None, objects: Optional[Callable] = None,
                 arrays: Optional[Callable] = None, user: Optional[Callable] = None, commute: bool = True) -> None:
        self._name = name
        self.native = native              # castmesh's op name, for castmesh's dtypes
        self._objects = objects           # f(x, y) on Python objects
        self._arrays = arrays             # f(invec, inoutvec) -> result, on NumPy arrays
        self._user = user                 # Op.Create's function(invec, inoutvec, datatype)
        self._commute = commute
        self._freed = False

    @classmethod
    def Create(cls, function: Callable[[Any, Any, Any], Any], commute: bool = False) -> "Op":  # noqa: N802
        """A user-defined op: ``function(invec, inoutvec, datatype)`` writes ``invec op inoutvec`` into ``inoutvec``."""
        if not callable(function):
            raise TypeError(f"Op.Create needs a callable, got {type(function).__name__}")
        return cls(getattr(function, "__name__", "user_op"), user=function, commute=bool(commute))

    def Free(self) -> None:  # noqa: N802
        if self._user is None:
            raise errors.Exception(errors.ERR_OP, f"cannot free the predefined op {self._name}")
        self._freed = True

    def Is_commutative(self) -> bool:  # noqa: N802
        return self._commute

    @property
    def is_commutative(self) -> bool:
        return self._commute

    def Is_predefined(self) -> bool:  # noqa: N802
        return self._user is None

    @property
    def is_predefined(self) -> bool:
        return self._user is None

    def __repr__(self) -> str:
        return f"<castmesh.MPI.Op {self._name}>"

    def __bool__(self) -> bool:
        return not self._freed

    def __call__(self, x: Any, y: Any) -> Any:
        """``x op y`` on Python objects (what the lower-case reductions fold with)."""
        if self._user is not None:
            return self._user(x, y, None)
        return self._objects(x, y)

    def check(self) -> None:
        if self._freed:
            raise errors.Exception(errors.ERR_OP, "the op was freed (MPI.OP_NULL)")

    def combine(self, invec: np.ndarray, inoutvec: np.ndarray, datatype: Datatype) -> np.ndarray:
        """``invec op inoutvec`` (``invec`` holds the lower ranks' data); returns the result array."""
        if self._user is not None:
            result = self._user(invec, inoutvec, datatype)
            return inoutvec if result is None else np.asarray(result, dtype=inoutvec.dtype)
        if self._arrays is None:
            raise errors.Exception(errors.ERR_OP, f"{self._name} is not defined on buffers")
        result = self._arrays(invec, inoutvec)
        return np.asarray(result).astype(inoutvec.dtype, copy=False)

    def native_op(self) -> Any:
        """What castmesh's Communicator takes for this op (a name or a collectives.Op), or None."""
        if self.native is not None:
            return self.native
        return None


def _logical(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda a, b: f(a, b)


def _obj_max(x: Any, y: Any) -> Any:
    return y if y > x else x


def _obj_min(x: Any, y: Any) -> Any:
    return y if y < x else x


SUM = Op("MPI_SUM", "sum", operator.add, np.add)
PROD = Op("MPI_PROD", "prod", operator.mul, np.multiply)
MAX = Op("MPI_MAX", "max", _obj_max, np.maximum)
MIN = Op("MPI_MIN", "min", _obj_min, np.minimum)
LAND = Op("MPI_LAND", "land", lambda x, y: bool(x and y), _logical(np.logical_and))
LOR = Op("MPI_LOR", "lor", lambda x, y: bool(x or y), _logical(np.logical_or))
LXOR = Op("MPI_LXOR", "lxor", lambda x, y: bool(x) != bool(y), _logical(np.logical_xor))
BAND = Op("MPI_BAND", "band", operator.and_, np.bitwise_and)
BOR = Op("MPI_BOR", "bor", operator.or_, np.bitwise_or)
BXOR = Op("MPI_BXOR", "bxor", operator.xor, np.bitwise_xor)
MAXLOC = Op("MPI_MAXLOC", None, _loc(operator.gt), _loc_arrays(np.greater))
MINLOC = Op("MPI_MINLOC", None, _loc(operator.lt), _loc_arrays(np.less))
REPLACE = Op("MPI_REPLACE", None, lambda x, y: x, lambda a, b: a, commute=False)
NO_OP = Op("MPI_NO_OP", None, lambda x, y: y, lambda a, b: b, commute=False)
OP_NULL = Op("MPI_OP_NULL")
OP_NULL._freed = True
