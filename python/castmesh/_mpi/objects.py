"""mpi4py's lower-case methods: any picklable Python object, point to point and collective.

Objects are pickled (highest protocol) into bytes. A receive probes for
the message's size first, then receives it whole. Collectives that move one
object per rank (gather, scatter, alltoall) are point-to-point messages on
the communicator's private duplicate; bcast and allgather use castmesh's
broadcast/allgather (sizes first, then the bytes); reductions fold the
gathered objects in rank order with ``op(x, y)`` (an ``MPI.Op`` or any
callable).
"""

from __future__ import annotations

import pickle
from functools import reduce as _fold
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from . import errors
from .constants import ANY_SOURCE, ANY_TAG, PROC_NULL
from .ops import SUM
from .requests import Request
from .status import Status
from .world import aux_of

_TAG = 1
_u8 = np.dtype(np.uint8)


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def loads(data: Any) -> Any:
    return pickle.loads(data)


def _receive(c: Any, source: int, tag: int, block: bool = True) -> Optional[tuple]:
    """(source, tag, nbytes, object) of the next matching message (None if ``not block`` and none is there)."""
    s = c.probe(source, tag, None) if block else c.iprobe(source, tag)
    if s is None:
        return None
    buf = bytearray(s.bytes)
    try:
        got = c.recv(buf, s.source, s.tag, None)
    except ValueError as error:
        raise errors.translate(error) from error
    return got.source, got.tag, got.bytes, loads(buf)


def _check_list(objs: Any, size: int, what: str) -> List[Any]:
    if objs is None or len(objs) != size:
        raise ValueError(f"{what}: expected a sequence of {size} objects (one per rank), got "
                         f"{'None' if objs is None else len(objs)}")
    return list(objs)


class Objects:
    """The pickle-based methods (mixed into Comm)."""

    __slots__ = ()

    # ---- point to point ----
    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        if dest == PROC_NULL:
            return
        self._get().send(dumps(obj), dest, tag)

    ssend = send
    bsend = send

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Optional[Status] = None) -> Any:
        del buf  # mpi4py's optional receive buffer: sizes are probed here instead
        if source == PROC_NULL:
            if status is not None:
                status.set(PROC_NULL, ANY_TAG, 0)
            return None
        src, t, n, obj = _receive(self._get(), source, tag)
        if status is not None:
            status.set(src, t, n)
        return obj

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        if dest == PROC_NULL:
            return Request(done=(PROC_NULL, ANY_TAG, 0))
        data = dumps(obj)
        r = Request(self._get().isend(data, dest, tag))
        r._keep = data
        return r

    issend = isend
    ibsend = isend

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        del buf
        if source == PROC_NULL:
            return Request(done=(PROC_NULL, ANY_TAG, 0))
        c = self._get()
        return Request(poll=lambda block: _receive(c, source, tag, block))

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Optional[Status] = None) -> Any:
        req = self.isend(sendobj, dest, sendtag)
        obj = self.recv(recvbuf, source, recvtag, status)
        req.Wait()
        return obj

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        return self.Iprobe(source, tag, status)

    # ---- collectives ----
    def barrier(self) -> None:
        self._get().barrier(False)

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        c = self._get()
        n = np.zeros(1, dtype=np.int64)
        data = None
        if c.rank == root:
            data = dumps(obj)
            n[0] = len(data)
        c.broadcast(n, root, False, None)
        buf = np.frombuffer(data, dtype=_u8) if data is not None else np.empty(int(n[0]), dtype=_u8)
        c.broadcast(buf, root, False, None)
        return obj if c.rank == root else loads(buf.tobytes())

    def _allgather_bytes(self, c: Any, data: bytes) -> List[bytes]:
        sizes = np.empty(c.size, dtype=np.int64)
        c.allgather(np.array([len(data)], dtype=np.int64), sizes, False, None)
        width = int(sizes.max())
        mine = np.zeros(width, dtype=_u8)
        mine[:len(data)] = np.frombuffer(data, dtype=_u8)
        out = np.empty(width * c.size, dtype=_u8)
        c.allgather(mine, out, False, None)
        return [out[i * width:i * width + int(sizes[i])].tobytes() for i in range(c.size)]

    def allgather(self, sendobj: Any) -> List[Any]:
        c = self._get()
        return [loads(b) for b in self._allgather_bytes(c, dumps(sendobj))]

    def gather(self, sendobj: Any, root: int = 0) -> Optional[List[Any]]:
        c = self._get()
        aux = aux_of(c)
        if c.rank != root:
            aux.send(dumps(sendobj), root, _TAG)
            return None
        out = []
        for i in range(c.size):
            out.append(sendobj if i == root else _receive(aux, i, _TAG)[3])
        return out

    def scatter(self, sendobj: Optional[Sequence[Any]] = None, root: int = 0) -> Any:
        c = self._get()
        aux = aux_of(c)
        if c.rank != root:
            return _receive(aux, root, _TAG)[3]
        objs = _check_list(sendobj, c.size, "scatter")
        sends = [aux.isend(dumps(o), i, _TAG) for i, o in enumerate(objs) if i != root]
        for s in sends:
            s.wait(None)
        return objs[root]

    def alltoall(self, sendobj: Sequence[Any]) -> List[Any]:
        c = self._get()
        aux = aux_of(c)
        objs = _check_list(sendobj, c.size, "alltoall")
        payloads = [dumps(o) for o in objs]
        sends = [aux.isend(payloads[i], i, _TAG) for i in range(c.size) if i != c.rank]
        out = [objs[i] if i == c.rank else _receive(aux, i, _TAG)[3] for i in range(c.size)]
        for s in sends:
            s.wait(None)
        return out

    def reduce(self, sendobj: Any, op: Callable[[Any, Any], Any] = SUM, root: int = 0) -> Any:
        items = self.gather(sendobj, root)
        return None if items is None else _fold(op, items)

    def allreduce(self, sendobj: Any, op: Callable[[Any, Any], Any] = SUM) -> Any:
        return _fold(op, self.allgather(sendobj))

    def scan(self, sendobj: Any, op: Callable[[Any, Any], Any] = SUM) -> Any:
        items = self.allgather(sendobj)
        return _fold(op, items[:self._get().rank + 1])

    def exscan(self, sendobj: Any, op: Callable[[Any, Any], Any] = SUM) -> Any:
        rank = self._get().rank
        if rank == 0:
            self.allgather(sendobj)
            return None
        return _fold(op, self.allgather(sendobj)[:rank])
