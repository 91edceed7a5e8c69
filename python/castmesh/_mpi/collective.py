"""Collective buffer methods of ``MPI.Comm`` (Barrier, Bcast, Reduce ... Alltoallv, Scan, Exscan).

Contiguous buffers of castmesh's dtypes with built-in ops (and user ops on
those dtypes) run in castmesh's C++ collectives, straight on the caller's
memory. Other datatypes (pairs for MAXLOC/MINLOC, complex, derived types)
are combined here: the inputs are allgathered (or gathered) and folded in
rank order, so non-commutative ops see ranks in order. Vector variants
(Gatherv ...) are point-to-point messages on a private duplicate of the
communicator. Counts in ``[buf, count, type]`` of Gather/Scatter/
Allgather/Alltoall are per rank, as in mpi4py; a count inferred from the
buffer is divided among the ranks.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from .. import collectives as _cm
from . import errors
from .buffers import IN_PLACE, Message, VectorMessage, message, store, vector_message
from .datatypes import Datatype
from .ops import SUM, Op
from .requests import Request
from .world import aux_of

_u8 = np.dtype(np.uint8)
_NATIVE_KINDS = "iufb"
_TAG = 0


def _native_dtype(t: Datatype) -> bool:
    dt = t._np
    return (t._contig and dt is not None and dt.fields is None and dt.kind in _NATIVE_KINDS
            and dt.itemsize <= 8 and dt.char != "g")


def _native_op(op: Op, t: Datatype) -> Any:
    """castmesh's op for ``op`` on ``t``, or None when the reduction runs here."""
    op.check()
    if not _native_dtype(t):
        return None
    if op.native is not None:
        if t._np.kind == "b" and op.native in ("sum", "prod"):
            return None
        return op.native
    if op._user is not None:
        user = op._user
        return _cm.Op(lambda a, b: user(a, b, t), commutative=op._commute, name=op._name)
    return None


class _Block(Message):
    """A Message that also knows its per-rank count."""

    __slots__ = ("per",)


def _blocks(spec: Any, size: int, writable: bool) -> _Block:
    m = message(spec, writable)
    explicit = isinstance(spec, (list, tuple)) and (len(spec) == 3 or (len(spec) == 2 and not isinstance(spec[1], Datatype)))
    if explicit:
        b = _Block(m.u8, m.count * size, m.datatype, m.offset)
        m.datatype.check_fits(m.u8.size, b.count, m.offset)
        b.per = m.count
        return b
    if size and m.count % size:
        raise ValueError(f"message: cannot split {m.count} items of the buffer into {size} equal blocks")
    b = _Block(m.u8, m.count, m.datatype, m.offset)
    b.per = m.count // size if size else 0
    return b


def _block_of(b: _Block, rank: int) -> Message:
    return Message(b.u8, b.per, b.datatype, b.offset + rank * b.per * b.datatype.extent)


def _typed(m: Message) -> np.ndarray:
    """A contiguous message of a basic datatype as a 1-D array of its element type (a view)."""
    return m.data().view(m.datatype._np)


def _fold(op: Op, parts: List[np.ndarray], t: Datatype) -> np.ndarray:
    acc = parts[0].copy()
    for x in parts[1:]:
        acc = op.combine(acc, x.copy(), t)
    return acc


def _call(f: Any, *args: Any) -> Any:
    try:
        return f(*args)
    except ValueError as error:
        raise errors.translate(error) from error


def _pending(req: Any, *keep: Any) -> Request:
    """A non-blocking call's Request, holding its buffers until it completes."""
    rq = Request(req)
    rq._keep = keep
    return rq


class Collectives:
    """The collective buffer methods (mixed into Comm)."""

    __slots__ = ()

    def Barrier(self) -> None:  # noqa: N802
        self._get().barrier(False)

    def Ibarrier(self) -> Request:  # noqa: N802
        return Request(self._get().barrier(True))

    # ---- broadcast ----
    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        self._bcast(buf, root, False)

    def Ibcast(self, buf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._bcast(buf, root, True)

    def _bcast(self, buf: Any, root: int, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        is_root = c.rank == root
        m = message(buf, not is_root)
        if m.datatype._contig:
            data = m.data()
            r = _call(c.broadcast, data, root, nonblocking, None)
            return Request(r) if nonblocking else None
        if nonblocking:
            raise NotImplementedError("castmesh.MPI: Ibcast of a non-contiguous datatype is not provided; use Bcast")
        data = m.data() if is_root else m.target()
        _call(c.broadcast, data, root, False, None)
        if not is_root:
            m.finish(data, data.size)
        return None

    # ---- reductions ----
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        self._allreduce(sendbuf, recvbuf, op, False)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:  # noqa: N802
        return self._allreduce(sendbuf, recvbuf, op, True)

    def _inputs(self, sendbuf: Any, r: Message) -> Message:
        if sendbuf is IN_PLACE:
            return r
        s = message(sendbuf, False)
        if s.count != r.count:
            raise ValueError(f"message: the send buffer has {s.count} items, the receive buffer {r.count}")
        return s

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: Op, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        r = message(recvbuf, True)
        s = self._inputs(sendbuf, r)
        nat = _native_op(op, r.datatype) if s.datatype._contig else None
        if nat is not None:
            out = _typed(r)
            inp = out if s is r else _typed(s)
            req = _call(c.allreduce, inp, out, nat, nonblocking, None)
            if nonblocking:
                return _pending(req, sendbuf, recvbuf, inp, out)
            return None
        if nonblocking:
            raise NotImplementedError(f"castmesh.MPI: Iallreduce with {op._name} on {r.datatype.name or 'a derived datatype'} "
                                      "is not provided; use Allreduce")
        local = s.typed()
        gathered = self._allgather_typed(c, local)
        store(r, _fold(op, gathered, r.datatype))
        return None

    def _allgather_typed(self, c: Any, local: np.ndarray) -> List[np.ndarray]:
        raw = np.ascontiguousarray(local).reshape(-1).view(_u8)
        out = np.empty(raw.size * c.size, dtype=_u8)
        _call(c.allgather, raw, out, False, None)
        return list(out.view(local.dtype).reshape(c.size, -1))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> None:  # noqa: N802
        self._reduce(sendbuf, recvbuf, op, root, False)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> Request:  # noqa: N802
        return self._reduce(sendbuf, recvbuf, op, root, True)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Op, root: int, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        is_root = c.rank == root
        if is_root:
            r = message(recvbuf, True)
            s = self._inputs(sendbuf, r)
        else:
            s = message(sendbuf, False)
            r = None
        t = s.datatype
        nat = _native_op(op, t) if (r is None or r.datatype._contig) else None
        if nat is not None:
            out = _typed(r) if r is not None else None
            inp = out if s is r else _typed(s)
            req = _call(c.reduce, inp, out, nat, root, nonblocking, None)
            if nonblocking:
                return _pending(req, sendbuf, recvbuf, inp, out)
            return None
        if nonblocking:
            raise NotImplementedError(f"castmesh.MPI: Ireduce with {op._name} is not provided here; use Reduce")
        local = np.ascontiguousarray(s.typed())
        raw = local.reshape(-1).view(_u8)
        out = np.empty(raw.size * c.size, dtype=_u8) if is_root else None
        _call(c.gather, raw, out, root, False, None)
        if is_root:
            store(r, _fold(op, list(out.view(local.dtype).reshape(c.size, -1)), r.datatype))
        return None

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        c = self._get()
        size = c.size
        if sendbuf is IN_PLACE:
            whole = _blocks(recvbuf, size, True)
            r = _block_of(whole, 0)
            s: Message = whole
        else:
            r = message(recvbuf, True)
            s = message(sendbuf, False)
            if s.count != r.count * size:
                raise ValueError(f"message: the send buffer has {s.count} items, expected {r.count} x {size} ranks")
        nat = _native_op(op, r.datatype) if s.datatype._contig else None
        if nat is not None and sendbuf is not IN_PLACE:
            _call(c.reduce_scatter, _typed(s), _typed(r), nat, False, None)
            return
        total = s.typed().copy()
        parts = self._allgather_typed(c, total)
        result = _fold(op, parts, s.datatype)
        n = r.count
        store(r, result[c.rank * n:(c.rank + 1) * n])

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Optional[List[int]] = None,  # noqa: N802
                       op: Op = SUM) -> None:
        c = self._get()
        if sendbuf is IN_PLACE:
            m = message(recvbuf, True)
            s = m
        else:
            s = message(sendbuf, False)
            m = message(recvbuf, True)
        counts = [int(x) for x in recvcounts] if recvcounts is not None else [m.count] * c.size
        if len(counts) != c.size or sum(counts) != s.count:
            raise ValueError(f"message: recvcounts {counts} do not add up to the {s.count} items sent by each rank")
        parts = self._allgather_typed(c, s.typed().copy())
        result = _fold(op, parts, s.datatype)
        start = sum(counts[:c.rank])
        mine = result[start:start + counts[c.rank]]
        store(Message(m.u8, counts[c.rank], m.datatype, m.offset), mine)

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        self._scan(sendbuf, recvbuf, op, inclusive=True)

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        self._scan(sendbuf, recvbuf, op, inclusive=False)

    def _scan(self, sendbuf: Any, recvbuf: Any, op: Op, inclusive: bool) -> None:
        c = self._get()
        op.check()
        r = message(recvbuf, True)
        s = self._inputs(sendbuf, r)
        parts = self._allgather_typed(c, s.typed().copy())
        upto = c.rank + 1 if inclusive else c.rank
        if upto == 0:
            return  # Exscan: rank 0's receive buffer is undefined in MPI; left as it is
        store(r, _fold(op, parts[:upto], r.datatype))

    # ---- gather / scatter / allgather / alltoall ----
    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        self._gather(sendbuf, recvbuf, root, False)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._gather(sendbuf, recvbuf, root, True)

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        if c.rank == root:
            r = _blocks(recvbuf, c.size, True)
            s = _block_of(r, root) if sendbuf is IN_PLACE else message(sendbuf, False)
        else:
            r = None
            s = message(sendbuf, False)
        contiguous = s.datatype._contig and (r is None or r.datatype._contig)
        if not contiguous and nonblocking:
            raise NotImplementedError("castmesh.MPI: Igather of a non-contiguous datatype is not provided; use Gather")
        inp = s.data()
        out = None
        if r is not None:
            out = r.data() if r.datatype._contig else np.empty(r.count * r.datatype.size, _u8)
        req = _call(c.gather, inp, out, root, nonblocking, None)
        if nonblocking:
            return _pending(req, sendbuf, recvbuf, inp, out)
        if r is not None and not r.datatype._contig:
            r.finish(out, out.size)
        return None

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        self._scatter(sendbuf, recvbuf, root, False)

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._scatter(sendbuf, recvbuf, root, True)

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        if c.rank == root:
            s = _blocks(sendbuf, c.size, False)
            r = _block_of(s, root) if recvbuf is IN_PLACE else message(recvbuf, True)
            inp = s.data()
        else:
            s = None
            r = message(recvbuf, True)
            inp = None
        if not r.datatype._contig and nonblocking:
            raise NotImplementedError("castmesh.MPI: Iscatter of a non-contiguous datatype is not provided; use Scatter")
        out = r.target()
        req = _call(c.scatter, inp, out, root, nonblocking, None)
        if nonblocking:
            return _pending(req, sendbuf, recvbuf, inp, out)
        r.finish(out, out.size)
        return None

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._allgather(sendbuf, recvbuf, False)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._allgather(sendbuf, recvbuf, True)

    def _allgather(self, sendbuf: Any, recvbuf: Any, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        r = _blocks(recvbuf, c.size, True)
        s = _block_of(r, c.rank) if sendbuf is IN_PLACE else message(sendbuf, False)
        if not r.datatype._contig and nonblocking:
            raise NotImplementedError("castmesh.MPI: Iallgather of a non-contiguous datatype is not provided")
        inp = s.data()
        out = r.target()
        req = _call(c.allgather, inp, out, nonblocking, None)
        if nonblocking:
            return _pending(req, sendbuf, recvbuf, inp, out)
        r.finish(out, out.size)
        return None

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._alltoall(sendbuf, recvbuf, False)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._alltoall(sendbuf, recvbuf, True)

    def _alltoall(self, sendbuf: Any, recvbuf: Any, nonblocking: bool) -> Optional[Request]:
        c = self._get()
        r = _blocks(recvbuf, c.size, True)
        s = r if sendbuf is IN_PLACE else _blocks(sendbuf, c.size, False)
        if s.count != r.count:
            raise ValueError(f"message: the send buffer has {s.count} items, the receive buffer {r.count}")
        if not r.datatype._contig and nonblocking:
            raise NotImplementedError("castmesh.MPI: Ialltoall of a non-contiguous datatype is not provided")
        inp = s.data().copy() if sendbuf is IN_PLACE else s.data()
        out = r.target()
        req = _call(c.alltoall, inp, out, nonblocking, None)
        if nonblocking:
            return _pending(req, sendbuf, recvbuf, inp, out)
        r.finish(out, out.size)
        return None

    # ---- vector variants: point to point on the private duplicate ----
    def _exchange(self, sends: List[Any], recvs: List[Any]) -> None:
        """Posts ``recvs`` [(rank, Message)] and ``sends`` [(rank, bytes)] on the duplicate; waits for all."""
        aux = aux_of(self._get())
        pending = []
        targets = []
        for src, m in recvs:
            t = m.target()
            targets.append((m, t))
            pending.append(aux.irecv(t, src, _TAG))
        for dest, data in sends:
            pending.append(aux.isend(data, dest, _TAG))
        for p in pending:
            _call(p.wait, None)
        for m, t in targets:
            m.finish(t, t.size)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        c = self._get()
        size, rank = c.size, c.rank
        if rank == root:
            rv = vector_message(recvbuf, size, True)
            recvs = [(i, rv.part(i)) for i in range(size) if i != root]
            if sendbuf is not IN_PLACE:
                _copy_into(message(sendbuf, False), rv.part(root))
            self._exchange([], recvs)
        else:
            self._exchange([(root, message(sendbuf, False).data())], [])

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        c = self._get()
        size, rank = c.size, c.rank
        if rank == root:
            sv = vector_message(sendbuf, size, False)
            if recvbuf is not IN_PLACE:
                _copy_into(sv.part(root), message(recvbuf, True))
            self._exchange([(i, sv.part(i).data()) for i in range(size) if i != root], [])
        else:
            self._exchange([], [(root, message(recvbuf, True))])

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        c = self._get()
        size, rank = c.size, c.rank
        rv = vector_message(recvbuf, size, True)
        if sendbuf is not IN_PLACE:
            _copy_into(message(sendbuf, False), rv.part(rank))
        data = rv.part(rank).data().copy()
        self._exchange([(i, data) for i in range(size) if i != rank],
                       [(i, rv.part(i)) for i in range(size) if i != rank])

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        c = self._get()
        size, rank = c.size, c.rank
        rv = vector_message(recvbuf, size, True)
        sv = _snapshot(vector_message(recvbuf, size, False)) if sendbuf is IN_PLACE else vector_message(sendbuf, size, False)
        _copy_into(sv.part(rank), rv.part(rank))
        self._exchange([(i, sv.part(i).data()) for i in range(size) if i != rank],
                       [(i, rv.part(i)) for i in range(size) if i != rank])


def _snapshot(v: VectorMessage) -> VectorMessage:
    return VectorMessage(v.u8.copy(), v.counts, v.displs, v.datatype)


def _copy_into(src: Message, dst: Message) -> None:
    data = src.data()
    if data.size > dst.nbytes:
        raise errors.Exception(errors.ERR_TRUNCATE, f"{data.size} bytes do not fit a block of {dst.nbytes}")
    target = dst.target()
    target[:data.size] = data
    dst.finish(target, data.size)
