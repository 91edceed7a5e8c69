"""Traces of message flow for Perfetto, and user spans (docs/observability.md).

``castmesh.trace.start(path)`` records, in this process and in every proc it
is connected to or starts afterwards, handler runs, messages between procs
(with flow arrows), collectives, RDMA operations and user spans;
``castmesh.trace.stop()`` gathers every proc's records and writes one Chrome
trace-event JSON file that https://ui.perfetto.dev opens. Setting
``CASTMESH_TRACE=path`` in the controller's environment does the same from
the start, and the file is written when the controller exits.

``castmesh.span(name)`` (a context manager) and ``@castmesh.traced`` put your
own slices in the same trace, nested inside the handler that runs them;
they cost one call while no trace records.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type, TypeVar, overload

from . import _castmesh

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["start", "stop", "recording", "span", "traced"]


def start(path: str) -> None:
    """Starts recording here, in the procs this process is connected to, and
    in every proc it starts from now on; ``stop()`` writes ``path``."""
    _castmesh.trace_start(os.fspath(path))


def stop(timeout: float = 10.0) -> Dict[str, Any]:
    """Stops recording everywhere, gathers the records and writes the file.

    Returns ``{"path", "procs", "records", "dropped", "unanswered"}``: the file,
    how many processes and records it holds, how many records the per-thread
    rings dropped (oldest first), and the procs that did not answer within
    ``timeout`` seconds (left out of the file)."""
    return dict(_castmesh.trace_stop(float(timeout)))


def recording() -> bool:
    """Whether this process records a trace now."""
    return bool(_castmesh.trace_recording())


class span:
    """A user span: ``with castmesh.span("load batch"): ...`` records the
    block as a slice on the calling thread (nothing while no trace records)."""

    __slots__ = ("_name", "_start")

    def __init__(self, name: str) -> None:
        self._name = name
        self._start = -1

    def __enter__(self) -> "span":
        self._start = _castmesh.trace_now_ns() if _castmesh.trace_recording() else -1
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        if self._start >= 0:
            _castmesh.trace_user_slice(self._name, self._start, _castmesh.trace_now_ns())


@overload
def traced(fn: F) -> F: ...
@overload
def traced(*, name: Optional[str] = None) -> Callable[[F], F]: ...


def traced(fn: Optional[F] = None, *, name: Optional[str] = None) -> Any:
    """Records every call of the decorated function as a user span named
    ``name`` (default: its qualified name). ``@traced`` or ``@traced(name=...)``."""

    def wrap(f: F) -> F:
        label = name or getattr(f, "__qualname__", getattr(f, "__name__", "traced"))

        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            with span(label):
                return f(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


def _write_at_exit() -> None:
    """A controller started with CASTMESH_TRACE writes the file when it exits
    (a worker proc hands its records to its controller instead)."""
    if os.environ.get("CASTMESH_BOOTSTRAP") or not recording():
        return
    try:
        stop()
    except Exception as error:  # noqa: BLE001 - at exit, say it and go on
        print(f"castmesh: writing the trace failed: {error}", flush=True)


if os.environ.get("CASTMESH_TRACE") and not os.environ.get("CASTMESH_BOOTSTRAP"):
    # Before the interpreter's atexit callbacks, which stop the procs (their
    # records must be gathered first): threading's exit hooks run when the
    # main thread ends, before atexit (concurrent.futures uses them alike).
    _register = getattr(threading, "_register_atexit", None)
    if _register is not None:
        _register(_write_at_exit)
    else:
        atexit.register(_write_at_exit)
