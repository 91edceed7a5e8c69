"""mpi4py's buffer specifications: ``buf``, ``[buf, datatype]``, ``[buf, count, datatype]``,
``[buf, (count, displ), datatype]`` and, for the vector collectives,
``[buf, counts, displs, datatype]`` / ``[buf, (counts, displs), datatype]``.

A spec becomes a :class:`Message`: the buffer's bytes as a NumPy ``uint8``
view (no copy), the count and the datatype. Contiguous datatypes are moved
straight from that view; others are packed/unpacked (datatypes.py).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import datatypes as dts
from .datatypes import Datatype
from .views import byte_view

_ndarray = np.ndarray
_u8 = np.dtype(np.uint8)


class _InPlace:
    """``MPI.IN_PLACE``: a collective's input is its output."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MPI.IN_PLACE"


class _Bottom:
    """``MPI.BOTTOM``: absolute addresses (only meaningful with absolute datatypes, which are not provided)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MPI.BOTTOM"


IN_PLACE = _InPlace()
BOTTOM = _Bottom()


def format_of(buf: Any) -> Tuple[str, int]:
    """The element format and size of a buffer (for inferring its datatype)."""
    if isinstance(buf, _ndarray):
        return buf.dtype.char, buf.dtype.itemsize
    mv = memoryview(buf)
    return mv.format, mv.itemsize


class Message:
    """One side of a transfer: ``count`` items of ``datatype`` in the buffer ``u8`` (from byte ``offset``)."""

    __slots__ = ("u8", "count", "datatype", "offset")

    def __init__(self, u8: np.ndarray, count: int, datatype: Datatype, offset: int = 0) -> None:
        self.u8 = u8
        self.count = count
        self.datatype = datatype
        self.offset = offset

    @property
    def nbytes(self) -> int:
        return self.count * self.datatype._size

    def contiguous(self) -> bool:
        return self.datatype._contig

    def data(self) -> np.ndarray:
        """The bytes to send: a view when contiguous, else a packed copy."""
        t = self.datatype
        if t._contig:
            start = self.offset
            return self.u8[start:start + self.count * t._size]
        return t.pack(self.u8[self.offset:], self.count)

    def target(self) -> np.ndarray:
        """Where a receive lands: the buffer itself when contiguous, else a scratch to unpack from."""
        t = self.datatype
        if t._contig:
            start = self.offset
            return self.u8[start:start + self.count * t._size]
        return np.empty(self.count * t._size, dtype=_u8)

    def finish(self, target: np.ndarray, nbytes: int) -> None:
        """After a receive of ``nbytes`` into ``target()``: unpack when the datatype is not contiguous."""
        t = self.datatype
        if not t._contig:
            t.unpack(target[:nbytes], self.u8[self.offset:], self.count)

    def typed(self) -> np.ndarray:
        """The items as a NumPy array of the datatype's element type (a view when contiguous)."""
        t = self.datatype
        dtype = t._np if t._np is not None else t._elem
        if dtype is None:
            raise TypeError(f"reductions need a datatype with one element type, not {t!r}")
        data = self.data()
        if not t._contig and t._np is None:
            return data.view(dtype)
        if dtype.itemsize != t._size and t._np is not None and t._np.fields:  # pair types: padded structs
            out = np.zeros(self.count, dtype=dtype)
            out.view(_u8).reshape(self.count, dtype.itemsize)[:, :t._size] = data.reshape(self.count, t._size)[:, :]
            return out
        return data.view(dtype)


def _datatype_of(buf: Any) -> Datatype:
    fmt, size = format_of(buf)
    return dts.from_format(fmt, size)


def _whole_count(nbytes: int, t: Datatype) -> int:
    extent = t.extent
    if extent <= 0:
        return 0
    if nbytes % extent:
        raise ValueError(f"message: cannot infer count, buffer length {nbytes} is not a multiple of datatype extent "
                         f"{extent} (lb:{t.lb}, ub:{t.ub})")
    return nbytes // extent


def message(spec: Any, writable: bool) -> Message:
    """The Message of a point-to-point or collective buffer spec (one count)."""
    if type(spec) is list or type(spec) is tuple:
        n = len(spec)
        buf = spec[0]
        u8 = byte_view(buf, writable)
        if n == 3:
            count, t = spec[1], spec[2]
            offset = 0
            if isinstance(count, (tuple, list)):
                count, displ = count
                offset = int(displ) * t.extent
            t._check()
            count = int(count)
            if count < 0:
                raise ValueError(f"message: negative count {count}")
            t.check_fits(u8.size, count, offset)
            return Message(u8, count, t, offset)
        if n == 2:
            second = spec[1]
            if isinstance(second, Datatype):
                second._check()
                return Message(u8, _whole_count(u8.size, second), second)
            t = _datatype_of(buf)
            count = int(second)
            t.check_fits(u8.size, count)
            return Message(u8, count, t)
        if n == 1:
            return message(buf, writable)
        raise ValueError(f"message: expected [buf, datatype] or [buf, count, datatype], got a sequence of {n} items")
    if spec is None or spec is BOTTOM:
        return Message(np.zeros(0, dtype=_u8), 0, dts.BYTE)
    u8 = byte_view(spec, writable)
    t = _datatype_of(spec)
    return Message(u8, _whole_count(u8.size, t), t)


class VectorMessage:
    """A vector collective's buffer: per-rank counts and displacements (in extents) of one datatype."""

    __slots__ = ("u8", "counts", "displs", "datatype")

    def __init__(self, u8: np.ndarray, counts: List[int], displs: List[int], datatype: Datatype) -> None:
        self.u8 = u8
        self.counts = counts
        self.displs = displs
        self.datatype = datatype

    def part(self, rank: int) -> Message:
        return Message(self.u8, self.counts[rank], self.datatype, self.displs[rank] * self.datatype.extent)


def vector_message(spec: Any, size: int, writable: bool) -> VectorMessage:
    """``[buf, counts, displs, datatype]``, ``[buf, (counts, displs), datatype]``, ``[buf, counts, datatype]``
    or ``[buf, counts]``; a plain buffer or a single count splits the buffer evenly."""
    if not isinstance(spec, (list, tuple)):
        spec = [spec]
    buf = spec[0]
    u8 = byte_view(buf, writable)
    rest = list(spec[1:])
    t: Optional[Datatype] = rest.pop() if rest and isinstance(rest[-1], Datatype) else None
    if t is None:
        t = _datatype_of(buf)
    t._check()
    counts: Optional[Sequence[int]] = None
    displs: Optional[Sequence[int]] = None
    if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2 and not isinstance(rest[0][0], int):
        counts, displs = rest[0]
    elif len(rest) == 2:
        counts, displs = rest
    elif len(rest) == 1:
        counts = rest[0]
    if counts is None:
        per = _whole_count(u8.size, t) // size if size else 0
        counts = [per] * size
    elif isinstance(counts, int):
        counts = [counts] * size
    counts = [int(c) for c in counts]
    if displs is None:
        displs = list(np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)) if counts else []
    elif isinstance(displs, int):
        displs = [displs] * size
    displs = [int(d) for d in displs]
    if len(counts) != size or len(displs) != size:
        raise ValueError(f"message: expected {size} counts and displacements, got {len(counts)} and {len(displs)}")
    for c, d in zip(counts, displs):
        t.check_fits(u8.size, c, d * t.extent)
    return VectorMessage(u8, counts, displs, t)


def store(msg: Message, values: np.ndarray) -> None:
    """Writes typed items (as :meth:`Message.typed` gives them) back into the message's buffer."""
    t = msg.datatype
    raw = np.ascontiguousarray(values).view(_u8)
    if t._np is not None and t._np.fields and t._np.itemsize != t._size:
        raw = raw.reshape(msg.count, t._np.itemsize)[:, :t._size].reshape(-1)
    if t._contig:
        msg.u8[msg.offset:msg.offset + raw.size] = raw
    else:
        t.unpack(np.ascontiguousarray(raw), msg.u8[msg.offset:], msg.count)
