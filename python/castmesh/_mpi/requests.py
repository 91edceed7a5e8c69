"""``MPI.Request`` and ``MPI.Prequest``: non-blocking operations and their completion.

A request wraps a castmesh Request (or nothing, when the operation was
complete at once, e.g. with PROC_NULL) plus what must happen once the data
is in: unpacking a derived datatype, unpickling an object, checking a
truncation. A completed non-persistent request equals ``REQUEST_NULL``, as
in mpi4py; a persistent one (``Send_init``/``Recv_init``) is restarted with
``Start``/``Startall``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from .. import _castmesh
from . import errors
from .constants import UNDEFINED
from .datatypes import Unavailable
from .status import Status

_wait_all = _castmesh.Request.wait_all

# After-completion hook: (source, tag, nbytes) -> the object lower-case wait() returns.
After = Callable[[int, int, int], Any]


class Request(Unavailable):
    """``MPI.Request``."""

    __slots__ = ("_cm", "_after", "_poll", "_active", "_st", "_result", "_keep")

    def __init__(self, cm: Any = None, after: Optional[After] = None, poll: Optional[Callable[[bool], Any]] = None,
                 done: Optional[Tuple[int, int, int]] = None) -> None:
        self._cm = cm            # a castmesh Request, or None
        self._after = after
        self._poll = poll        # poll(block) -> (source, tag, nbytes, result) or None: requests done in Python
        self._active = cm is not None or poll is not None or done is not None
        self._st = done          # (source, tag, nbytes) once complete
        self._result: Any = None
        self._keep: Any = None   # buffers the operation uses until it completes (mpi4py keeps them too)

    # ---- completion machinery ----
    def _complete(self, block: bool) -> bool:
        """True once complete (waiting when ``block``); runs the after-hook once."""
        if self._st is not None:
            return True
        if not self._active:
            return True
        try:
            if self._poll is not None:
                got = self._poll(block)
                if got is None:
                    return False
                src, tag, nbytes, self._result = got
                self._st = (src, tag, nbytes)
                return True
            cm = self._cm
            if not block and not cm.test():
                return False
            s = cm.wait(None)
        except Exception as error:  # noqa: BLE001 - castmesh errors become MPI's
            self._cm = None
            self._active = False
            raise errors.translate(error) from error
        self._st = (s.source, s.tag, s.bytes)
        if self._after is not None:
            self._result = self._after(s.source, s.tag, s.bytes)
        return True

    def _retire(self, status: Optional[Status]) -> Any:
        """Fills ``status``, makes the request inactive (REQUEST_NULL) and returns its result."""
        st = self._st
        if status is not None:
            if st is None:
                status.set(-2, -1, 0)  # an inactive request: an empty status
            else:
                status.set(st[0], st[1], st[2])
        result = self._result
        self._reset()
        return result

    def _reset(self) -> None:
        self._cm = None
        self._poll = None
        self._after = None
        self._active = False
        self._st = None
        self._result = None
        self._keep = None

    # ---- mpi4py API ----
    def Wait(self, status: Optional[Status] = None) -> bool:  # noqa: N802
        self._complete(True)
        self._retire(status)
        return True

    def Test(self, status: Optional[Status] = None) -> bool:  # noqa: N802
        if not self._complete(False):
            return False
        self._retire(status)
        return True

    def wait(self, status: Optional[Status] = None) -> Any:
        self._complete(True)
        return self._retire(status)

    def test(self, status: Optional[Status] = None) -> Tuple[bool, Any]:
        if not self._complete(False):
            return False, None
        return True, self._retire(status)

    def Get_status(self, status: Optional[Status] = None) -> bool:  # noqa: N802
        """True when complete, without freeing the request."""
        done = self._complete(False)
        if done and status is not None and self._st is not None:
            status.set(*self._st)
        return done

    def Free(self) -> None:  # noqa: N802
        """Lets the operation finish on its own (MPI_Request_free)."""
        self._reset()

    def Cancel(self) -> None:  # noqa: N802
        raise NotImplementedError("castmesh.MPI: Request.Cancel is not provided (castmesh cannot withdraw a "
                                  "posted operation); wait for it instead")

    def __bool__(self) -> bool:
        return self._active

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Request):
            if not self._active and not other._active:
                return True
            return self is other
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<castmesh.MPI.{type(self).__name__} {'active' if self._active else 'null'}>"

    # ---- many requests ----
    @classmethod
    def Waitall(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> bool:  # noqa: N802
        native = [r._cm for r in requests if r._active and r._st is None and r._cm is not None]
        if len(native) > 1:
            try:
                _wait_all(native, None)
            except Exception as error:  # noqa: BLE001
                raise errors.translate(error) from error
        for i, r in enumerate(requests):
            r._complete(True)
            st = _status_slot(statuses, i)
            r._finish_one(st)
        return True

    @classmethod
    def waitall(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> List[Any]:
        out = []
        for i, r in enumerate(requests):
            r._complete(True)
            out.append(r._finish_one(_status_slot(statuses, i)))
        return out

    @classmethod
    def Testall(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> bool:  # noqa: N802
        if not all(r._complete(False) for r in requests):
            return False
        for i, r in enumerate(requests):
            r._finish_one(_status_slot(statuses, i))
        return True

    @classmethod
    def testall(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> Tuple[bool, Any]:
        if not all(r._complete(False) for r in requests):
            return False, None
        return True, [r._finish_one(_status_slot(statuses, i)) for i, r in enumerate(requests)]

    @classmethod
    def Waitany(cls, requests: Sequence["Request"], status: Optional[Status] = None) -> int:  # noqa: N802
        index, _ = cls._any(requests, status, True)
        return index

    @classmethod
    def waitany(cls, requests: Sequence["Request"], status: Optional[Status] = None) -> Tuple[int, Any]:
        return cls._any(requests, status, True)

    @classmethod
    def Testany(cls, requests: Sequence["Request"], status: Optional[Status] = None) -> Tuple[int, bool]:  # noqa: N802
        index, _ = cls._any(requests, status, False)
        return index, index != UNDEFINED or not any(r._active for r in requests)

    @classmethod
    def testany(cls, requests: Sequence["Request"], status: Optional[Status] = None) -> Tuple[int, bool, Any]:
        index, result = cls._any(requests, status, False)
        return index, index != UNDEFINED or not any(r._active for r in requests), result

    @classmethod
    def Waitsome(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> Optional[List[int]]:  # noqa: N802
        if not any(r._active for r in requests):
            return None
        first = cls.Waitany(requests)
        done = [first] + [i for i, r in enumerate(requests) if i != first and r._active and r._complete(False)]
        for n, i in enumerate(done):
            if i != first:
                requests[i]._finish_one(_status_slot(statuses, n))
        return done

    @classmethod
    def Testsome(cls, requests: Sequence["Request"], statuses: Optional[List[Status]] = None) -> Optional[List[int]]:  # noqa: N802
        if not any(r._active for r in requests):
            return None
        done = [i for i, r in enumerate(requests) if r._active and r._complete(False)]
        for n, i in enumerate(done):
            requests[i]._finish_one(_status_slot(statuses, n))
        return done

    @classmethod
    def _any(cls, requests: Sequence["Request"], status: Optional[Status], block: bool) -> Tuple[int, Any]:
        if not any(r._active for r in requests):
            if status is not None:
                status.set(-2, -1, 0)
            return UNDEFINED, None
        while True:
            for i, r in enumerate(requests):
                if r._active and r._complete(False):
                    return i, r._finish_one(status)
            if not block:
                return UNDEFINED, None
            native = [r._cm for r in requests if r._active and r._cm is not None and r._st is None]
            if native and len(native) == sum(1 for r in requests if r._active):
                try:
                    _castmesh.Request.wait_any(native, None)
                except Exception as error:  # noqa: BLE001
                    raise errors.translate(error) from error
            else:
                import time  # noqa: PLC0415 - only when polling Python-side requests
                time.sleep(0.0001)

    def _finish_one(self, status: Optional[Status]) -> Any:
        return self._retire(status)


def _status_slot(statuses: Optional[List[Status]], i: int) -> Optional[Status]:
    if statuses is None:
        return None
    while len(statuses) <= i:
        statuses.append(Status())
    return statuses[i]


class Prequest(Request):
    """``MPI.Prequest``: a persistent request (``Send_init``/``Recv_init``) started again with ``Start``."""

    __slots__ = ("_start", "_started")

    def __init__(self, start: Callable[[], Request]) -> None:
        super().__init__()
        self._start = start
        self._started = False
        self._active = True  # a persistent request is never REQUEST_NULL until freed

    def Start(self) -> None:  # noqa: N802
        if self._start is None:
            raise errors.Exception(errors.ERR_REQUEST, "Start on a freed persistent request")
        inner = self._start()
        self._cm, self._after, self._poll, self._st, self._keep = (inner._cm, inner._after, inner._poll, inner._st,
                                                                    inner._keep)
        self._result = None
        self._started = True

    @classmethod
    def Startall(cls, requests: Sequence["Prequest"]) -> None:  # noqa: N802
        for r in requests:
            r.Start()

    def _complete(self, block: bool) -> bool:
        if not self._started:
            return True
        return super()._complete(block)

    def _retire(self, status: Optional[Status]) -> Any:
        if not self._started:
            if status is not None:
                status.set(-2, -1, 0)
            return None
        st = self._st
        if status is not None and st is not None:
            status.set(*st)
        result = self._result
        self._cm = self._after = self._poll = self._st = self._result = None
        self._started = False
        return result

    def Free(self) -> None:  # noqa: N802
        if self._started:
            self._complete(True)
        self._reset()
        self._start = None  # type: ignore[assignment]
        self._started = False


REQUEST_NULL = Request()
