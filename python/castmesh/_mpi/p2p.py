"""Point-to-point buffer methods of ``MPI.Comm``: Send/Recv and their modes, Sendrecv, Probe,
non-blocking and persistent forms, and buffered sends with Attach_buffer/Detach_buffer.

Data moves through castmesh's send/recv straight from and into the
caller's buffer for contiguous datatypes (packed copies otherwise). A rank
of PROC_NULL makes a call do nothing, as in MPI. ``Ssend`` and ``Rsend``
are standard sends (castmesh has no synchronous mode: an Ssend may return
before the receive is posted); ``Bsend`` copies the message out of the
caller's buffer, within the attached buffer's capacity.
"""

from __future__ import annotations

import mmap
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import errors
from .buffers import byte_view, message
from .constants import ANY_SOURCE, ANY_TAG, BSEND_OVERHEAD, PROC_NULL
from .datatypes import Datatype, from_format
from .requests import Prequest, Request
from .status import Status


class _AttachedBuffer:
    """The buffer of MPI_Buffer_attach and the buffered sends still using it."""

    def __init__(self) -> None:
        self.buffer: Any = None
        self.capacity = 0
        self.pending: List[Tuple[Request, int]] = []

    def reserve(self, nbytes: int) -> None:
        if self.buffer is None:
            raise errors.Exception(errors.ERR_BUFFER, "Bsend needs a buffer: call MPI.Attach_buffer first")
        self.pending = [(r, n) for r, n in self.pending if not r._complete(False)]
        used = sum(n + BSEND_OVERHEAD for _, n in self.pending)
        if used + nbytes + BSEND_OVERHEAD > self.capacity:
            raise errors.Exception(errors.ERR_BUFFER, f"the attached buffer ({self.capacity} bytes, {used} in use) "
                                   f"cannot hold {nbytes} more bytes plus MPI.BSEND_OVERHEAD ({BSEND_OVERHEAD})")

    def attach(self, buf: Any) -> None:
        if self.buffer is not None:
            raise errors.Exception(errors.ERR_BUFFER, "a buffer is already attached; Detach_buffer it first")
        self.buffer = buf
        self.capacity = byte_view(buf, writable=False).size

    def detach(self) -> Any:
        for r, _ in self.pending:  # MPI: detaching waits for the buffered messages to leave
            r._complete(True)
        self.pending = []
        buf, self.buffer, self.capacity = self.buffer, None, 0
        return buf


attached = _AttachedBuffer()


# Buffers whose bytes the fast path takes through the buffer protocol (a
# C-contiguous export; anything else raises BufferError there and takes the
# general path).
_BYTE_BUFFERS = frozenset((bytearray, bytes, mmap.mmap))
_WHOLE_BUFFERS = _BYTE_BUFFERS | {np.ndarray}
# Per NumPy dtype: whether a plain array of it has a predefined datatype
# (else the general path raises mpi4py's error for it).
_typed: Dict[np.dtype, bool] = {}


def _has_datatype(dtype: np.dtype) -> bool:
    known = _typed.get(dtype)
    if known is None:
        try:
            from_format(dtype.char, dtype.itemsize)
            known = not dtype.hasobject
        except TypeError:
            known = False
        _typed[dtype] = known
    return known


def _span(spec: Any) -> Optional[Tuple[Any, int, int]]:
    """(buffer, byte offset, byte count; -1: to the end) of the specs a blocking Send/Recv meets most --
    a plain buffer, or ``[buf, count, datatype]`` with a contiguous datatype -- or None for every other
    spec (``message`` handles those, and every error). Parsing the spec was most of castmesh.MPI's own
    time per small message (NumPy views per call)."""
    tp = type(spec)
    if tp is list or tp is tuple:
        n = len(spec)
        if n == 3:
            buf, count, t = spec
            if type(count) is int and count >= 0 and type(t) is Datatype and t._contig and not t._freed \
                    and type(buf) in _WHOLE_BUFFERS:
                return buf, 0, count * t._size
        return None
    if tp in _BYTE_BUFFERS or (tp is np.ndarray and _has_datatype(spec.dtype)):
        return spec, 0, -1
    return None


def _check_tag(tag: int, receive: bool) -> int:
    tag = int(tag)
    if tag < 0 and not (receive and tag == ANY_TAG):
        raise errors.Exception(errors.ERR_TAG, f"invalid tag {tag}")
    return tag


class PointToPoint:
    """The buffer point-to-point methods (mixed into Comm; ``self._get()`` is the castmesh communicator)."""

    __slots__ = ()

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        span = _span(buf)
        if span is not None and dest != PROC_NULL:
            try:
                self._get().send_bytes(span[0], span[1], span[2], int(dest), int(tag))  # int(): 1.0 works (osu_multi_lat)
                return
            except BufferError:
                pass  # not C-contiguous: the general path below says so, or copes (Fortran order)
            except ValueError as error:
                raise errors.translate(error) from error
        m = message(buf, False)
        if dest == PROC_NULL:
            return
        try:
            self._get().send(m.data(), int(dest), int(tag))
        except ValueError as error:
            raise errors.translate(error) from error

    Ssend = Send
    Rsend = Send

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,  # noqa: N802
             status: Optional[Status] = None) -> None:
        span = _span(buf)
        if span is not None and source != PROC_NULL:
            try:
                got = self._get().recv_bytes(span[0], span[1], span[2], int(source), int(tag))
            except BufferError:
                got = None  # not C-contiguous, or read-only: the general path below says so, or copes
            except ValueError as error:
                raise errors.translate(error) from error
            if got is not None:
                if status is not None:
                    status.set(got[0], got[1], got[2])
                return
        m = message(buf, True)
        if source == PROC_NULL:
            if status is not None:
                status.set(PROC_NULL, ANY_TAG, 0)
            return
        target = m.target()
        try:
            s = self._get().recv(target, int(source), int(tag), None)
        except ValueError as error:
            raise errors.translate(error) from error
        if not m.datatype._contig:
            m.finish(target, s.bytes)
        if status is not None:
            status.set(s.source, s.tag, s.bytes)

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        m = message(buf, False)
        if dest == PROC_NULL:
            return Request(done=(PROC_NULL, ANY_TAG, 0))
        data = m.data()
        try:
            r = Request(self._get().isend(data, int(dest), int(tag)))
        except ValueError as error:
            raise errors.translate(error) from error
        r._keep = (buf, data)
        return r

    Issend = Isend
    Irsend = Isend

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        m = message(buf, True)
        if source == PROC_NULL:
            return Request(done=(PROC_NULL, ANY_TAG, 0))
        target = m.target()
        after = None
        if not m.datatype._contig:
            def after(src: int, t: int, nbytes: int) -> None:
                m.finish(target, nbytes)
        r = Request(self._get().irecv(target, int(source), int(tag)), after)
        r._keep = (buf, target)
        return r

    def Bsend(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        self.Ibsend(buf, dest, tag)

    def Ibsend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        m = message(buf, False)
        if dest == PROC_NULL:
            return Request(done=(PROC_NULL, ANY_TAG, 0))
        copy = np.array(m.data(), copy=True)
        attached.reserve(copy.size)
        inner = Request(self._get().isend(copy, dest, tag))
        inner._keep = copy
        attached.pending.append((inner, copy.size))
        return Request(done=(dest, tag, copy.size))  # complete once copied, as MPI's buffered mode

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        send = self.Isend(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag, status)
        send.Wait()

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,  # noqa: N802
                         recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        m = message(buf, False)
        copy = np.array(m.data(), copy=True)
        send = None if dest == PROC_NULL else Request(self._get().isend(copy, dest, sendtag))
        self.Recv(buf, source, recvtag, status)
        if send is not None:
            send.Wait()

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            if status is not None:
                status.set(PROC_NULL, ANY_TAG, 0)
            return True
        s = self._get().probe(source, tag, None)
        if status is not None:
            status.set(s.source, s.tag, s.bytes)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            if status is not None:
                status.set(PROC_NULL, ANY_TAG, 0)
            return True
        s = self._get().iprobe(source, tag)
        if s is None:
            return False
        if status is not None:
            status.set(s.source, s.tag, s.bytes)
        return True

    # ---- persistent requests ----
    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:  # noqa: N802
        message(buf, False)  # argument errors now, not at Start
        return Prequest(lambda: self.Isend(buf, dest, tag))

    Ssend_init = Send_init
    Rsend_init = Send_init

    def Bsend_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:  # noqa: N802
        message(buf, False)
        return Prequest(lambda: self.Ibsend(buf, dest, tag))

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:  # noqa: N802
        message(buf, True)
        return Prequest(lambda: self.Irecv(buf, source, tag))

    # MPI-4.1 communicator-local buffers: the process's one buffer here.
    def Attach_buffer(self, buf: Any) -> None:  # noqa: N802
        attached.attach(buf)

    def Detach_buffer(self) -> Any:  # noqa: N802
        return attached.detach()
