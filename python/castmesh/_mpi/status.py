"""``MPI.Status``: what a receive or probe matched (source, tag, error, byte count)."""

from __future__ import annotations

from typing import Any, Optional

from . import errors
from .constants import ANY_SOURCE, ANY_TAG, UNDEFINED
from .datatypes import BYTE, Datatype, Unavailable


class Status(Unavailable):
    """``MPI.Status``; ``Get_count(datatype)`` divides the received bytes by the datatype's size."""

    __slots__ = ("source", "tag", "error", "_nbytes", "_cancelled")

    def __init__(self, status: Optional["Status"] = None) -> None:
        self.source: int = ANY_SOURCE if status is None else status.source
        self.tag: int = ANY_TAG if status is None else status.tag
        self.error: int = errors.SUCCESS if status is None else status.error
        self._nbytes: int = 0 if status is None else status._nbytes
        self._cancelled = False if status is None else status._cancelled

    def set(self, source: int, tag: int, nbytes: int, error: int = errors.SUCCESS) -> None:
        self.source, self.tag, self._nbytes, self.error = source, tag, nbytes, error

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Set_source(self, source: int) -> None:  # noqa: N802
        self.source = int(source)

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag

    def Set_tag(self, tag: int) -> None:  # noqa: N802
        self.tag = int(tag)

    def Get_error(self) -> int:  # noqa: N802
        return self.error

    def Set_error(self, error: int) -> None:  # noqa: N802
        self.error = int(error)

    def Get_count(self, datatype: Datatype = BYTE) -> int:  # noqa: N802
        """Items of ``datatype`` received (UNDEFINED when the bytes are not a whole number of them)."""
        size = datatype.size
        if size == 0:
            return 0 if self._nbytes == 0 else UNDEFINED
        return self._nbytes // size if self._nbytes % size == 0 else UNDEFINED

    def Get_elements(self, datatype: Datatype) -> int:  # noqa: N802
        """Basic elements received (derived datatypes count their elements, not whole items)."""
        elem = datatype._elem if datatype._elem is not None else None
        if elem is None or datatype._np is not None:
            per = 2 if datatype._np is not None and datatype._np.fields else 1
            whole = self.Get_count(datatype)
            return whole * per if whole != UNDEFINED else UNDEFINED
        return self._nbytes // elem.itemsize

    def Set_elements(self, datatype: Datatype, count: int) -> None:  # noqa: N802
        self._nbytes = int(count) * datatype.size

    def Is_cancelled(self) -> bool:  # noqa: N802
        return self._cancelled

    def Set_cancelled(self, flag: bool) -> None:  # noqa: N802
        self._cancelled = bool(flag)

    @property
    def count(self) -> int:
        return self._nbytes

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __repr__(self) -> str:
        return f"<castmesh.MPI.Status source={self.source} tag={self.tag} error={self.error} count={self._nbytes}>"

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return (self.source, self.tag, self.error, self._nbytes) == (other.source, other.tag, other.error, other._nbytes)

    __hash__ = None  # type: ignore[assignment]


def fill(status: Optional[Status], source: int, tag: int, nbytes: int) -> None:
    if status is not None:
        status.set(source, tag, nbytes)
