"""One-sided reads and writes of memory another proc registered.

The owner wraps memory it keeps (a NumPy array, a ``bytearray``, a PyTorch
CPU tensor: anything with ``__dlpack__`` or the buffer protocol, taken
without a copy)::

    buf = castmesh.rdma.RdmaBuffer(weights)        # in the trainer actor
    return buf                                      # handles travel inside any message

and any proc holding the handle moves bytes without the owner's actors
taking part::

    buf.read_into(my_array).get()                   # remote -> local
    buf.write_from(update, offset=4096).get()       # local -> remote

Each operation takes the best path both procs have: memcpy in one process,
a single cross-memory copy between processes of one host, the proc
connection (chunked, all in flight) otherwise. ``castmesh.rdma.RDMABuffer``,
``RDMAAction`` and ``drop()`` keep Monarch's spellings, so Monarch code
ports by changing the import. See docs/rdma.md.
"""

from __future__ import annotations

import warnings
from typing import Any, List, NamedTuple, Optional, Tuple

from . import _castmesh
from .errors import RdmaError
from .future import Future

__all__ = ["RdmaBuffer", "RdmaBatch", "RdmaError", "RdmaResult", "RDMABuffer", "RDMAAction",
           "RDMAReadTransferWarning", "RDMAWriteTransferWarning", "RDMATcpFallbackWarning",
           "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"]


# Monarch's warning classes, so code that filters them runs unchanged;
# castmesh's transfers warn with none of them (a transport is not a fallback:
# RdmaResult.transport says which one moved the bytes).
class RDMAReadTransferWarning(Warning):
    """Monarch's; never raised by castmesh."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's; never raised by castmesh."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's; never raised by castmesh."""


def is_ibverbs_available() -> bool:
    """Whether this proc has an RDMA NIC through castmesh's ``rdma`` backend (ibverbs)."""
    return any(b.name == "rdma" and b.available for b in _castmesh.backends())


def get_rdma_backend() -> str:
    """``"ibverbs"`` where :func:`is_ibverbs_available`, else ``"tcp"``: castmesh
    then moves bytes through memory shared by the procs of a host or over the
    proc connection (Monarch's TCP fallback). Never ``"none"``."""
    return "ibverbs" if is_ibverbs_available() else "tcp"


def is_rdma_available() -> bool:
    """Deprecated, as in Monarch: :func:`is_ibverbs_available`."""
    warnings.warn("is_rdma_available() is deprecated: use is_ibverbs_available() or get_rdma_backend()",
                  DeprecationWarning, stacklevel=2)
    return is_ibverbs_available()


class RdmaResult(NamedTuple):
    """What one finished operation moved, and over which transport."""

    bytes: int
    # "same_process", "single_copy", "shared_segment", "socket" or "ibverbs"; with "+host_staging"
    # when device (CUDA/ROCm) memory on either side went through host memory (docs/rdma.md)
    transport: str


def _future(pending: Any, one: bool) -> "Future[Any]":
    # The binding builds the RdmaResults itself (no Python code per result).
    return Future(pending.wait_one if one else pending.wait, pending.on_done)


def _rebuild(serialized: bytes) -> "RdmaBuffer":
    buf = RdmaBuffer.__new__(RdmaBuffer)
    buf._handle = _castmesh.RdmaHandle.deserialize(serialized)
    return buf


class RdmaBuffer:
    """A handle on registered memory; pickles to a few dozen bytes.

    ``RdmaBuffer(obj, access="rw")`` registers ``obj`` in this proc (``"r"``:
    others may only read it). The memory stays alive while the handle's
    registration is live or an operation on it is in flight.
    """

    __slots__ = ("_handle",)

    def __init__(self, data: Any, access: str = "rw") -> None:
        self._handle = _castmesh.RdmaHandle.register(data, access)

    def size(self) -> int:
        """Registered bytes."""
        return int(self._handle.size())

    @property
    def owner(self) -> str:
        """The proc whose memory this is."""
        return str(self._handle.owner)

    @property
    def transports(self) -> List[str]:
        """The transports the owner offers, best first."""
        return list(self._handle.transports)

    def backend(self) -> str:
        """Monarch's: ``"ibverbs"`` when the owner offers an RDMA NIC, else ``"tcp"``
        (see :func:`get_rdma_backend`; ``transports`` lists them all)."""
        return "ibverbs" if "ibverbs" in self.transports else "tcp"

    def read_into(self, dst: Any, offset: int = 0, timeout: Optional[float] = 60.0, *,
                  length: Optional[int] = None) -> "Future[RdmaResult]":
        """Copies ``length`` bytes (default: all of ``dst``) from ``offset`` of this buffer into ``dst``.

        ``offset`` and ``timeout`` (seconds; ``None``: none) may be positional, as in Monarch."""
        return _future(self._handle.read_into(dst, offset, length, timeout), True)

    def write_from(self, src: Any, offset: int = 0, timeout: Optional[float] = 60.0) -> "Future[RdmaResult]":
        """Copies all of ``src`` into this buffer at ``offset``."""
        return _future(self._handle.write_from(src, offset, timeout), True)

    def release(self, timeout: Optional[float] = 60.0) -> "Future[None]":
        """Releases the registration (from any proc, idempotent); later operations fail."""
        pending = self._handle.release(timeout)
        return Future(lambda t: (pending.wait(t), None)[1], pending.on_done)

    # Monarch spelling.
    def drop(self) -> "Future[None]":
        """Alias of :meth:`release` (Monarch's name)."""
        return self.release()

    def __reduce__(self) -> Tuple[Any, Tuple[bytes]]:
        return (_rebuild, (bytes(self._handle.serialize()),))

    def __repr__(self) -> str:
        return repr(self._handle)


class RdmaBatch:
    """Several reads and writes with one completion: ``submit()`` returns a
    Future of every :class:`RdmaResult`, in order, or the first error.
    Writes that overlap an earlier write to the same buffer are refused."""

    def __init__(self) -> None:
        self._ops: List[Tuple[Any, Any, bool, int, Optional[int]]] = []

    def read_into(self, buffer: RdmaBuffer, dst: Any, *, offset: int = 0,
                  length: Optional[int] = None) -> "RdmaBatch":
        """Adds a read of ``buffer`` into ``dst``."""
        self._ops.append((buffer._handle, dst, False, offset, length))
        return self

    def write_from(self, buffer: RdmaBuffer, src: Any, *, offset: int = 0) -> "RdmaBatch":
        """Adds a write of ``src`` into ``buffer``."""
        self._ops.append((buffer._handle, src, True, offset, None))
        return self

    # Monarch's RDMAAction spellings (its argument order).
    def read_remote(self, dst: Any, src: RdmaBuffer, *, offset: int = 0,
                    length: Optional[int] = None) -> "RdmaBatch":
        """Adds a read of buffer ``src`` into local memory ``dst`` (Monarch's order).
        ``read_remote(buffer, dst)``, castmesh's order before 0.2, still works
        for now, with a DeprecationWarning."""
        if isinstance(dst, RdmaBuffer) and not isinstance(src, RdmaBuffer):
            warnings.warn("RDMAAction.read_remote(buffer, dst) is deprecated: pass (dst, buffer), Monarch's order",
                          DeprecationWarning, stacklevel=2)
            dst, src = src, dst
        if not isinstance(src, RdmaBuffer):
            raise TypeError(f"read_remote(dst, src): src must be an RdmaBuffer, not {type(src).__name__}")
        return self.read_into(src, dst, offset=offset, length=length)

    write_remote = write_from  # (dst buffer, src memory): Monarch's order already

    def submit(self, timeout: Optional[float] = 60.0) -> "Future[List[RdmaResult]]":
        """Starts every operation; overlapping writes raise ValueError here."""
        return _future(_castmesh.rdma_submit_batch(self._ops, timeout), False)


# Monarch-compatible names.
RDMABuffer = RdmaBuffer
"""Monarch's name for :class:`RdmaBuffer`."""
RDMAAction = RdmaBatch
"""Monarch's name for :class:`RdmaBatch`."""
