"""Futures of castmesh calls: ``.get(timeout=...)`` or ``await``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Generator, Generic, List, Optional, TypeVar

T = TypeVar("T")

__all__ = ["Future"]  # gather and in_thread are castmesh-internal


class Future(Generic[T]):
    """The result of a call: block with :meth:`get` or ``await`` it.

    ``get`` waits in C++ with the GIL released, so other Python threads keep
    running. ``await`` bridges the C++ completion callback into the running
    asyncio loop (``loop.call_soon_threadsafe``), never blocking the loop.
    A future may be waited on several times; it always gives the same result.
    """

    __slots__ = ("_wait", "_on_done", "_done", "_value", "_error")

    def __init__(
        self,
        wait: Callable[[Optional[float]], Any],
        on_done: Callable[[Callable[[], None]], None],
    ) -> None:
        # wait(timeout) -> value, raising the call's error or TimeoutError.
        # on_done(cb) arranges cb() (any thread) once wait would not block.
        self._wait = wait
        self._on_done = on_done
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None

    @classmethod
    def ready(cls, value: T) -> "Future[T]":
        """A future that already holds ``value``."""
        fut: Future[T] = cls(lambda timeout: value, lambda cb: cb())
        return fut

    def get(self, timeout: Optional[float] = None) -> T:
        """Waits for the result (at most ``timeout`` seconds; ``None``: no limit).

        Raises the call's error (:class:`~castmesh.ActorError`,
        :class:`~castmesh.ProcError`), or :class:`TimeoutError` when the
        result is not there in time (the future can be waited on again).
        """
        if not self._done:
            try:
                value = self._wait(timeout)
            except TimeoutError:
                raise
            except BaseException as error:  # noqa: BLE001 - stored and re-raised each time
                self._error, self._done = error, True
            else:
                self._value, self._done = value, True
        if self._error is not None:
            raise self._error
        return self._value

    def result(self, timeout: Optional[float] = None) -> T:
        """Alias of :meth:`get` (concurrent.futures spelling)."""
        return self.get(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The call's error, or ``None`` if it succeeded."""
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except BaseException as error:  # noqa: BLE001
            return error
        return None

    def done(self) -> bool:
        """True when :meth:`get` would not block."""
        if self._done:
            return True
        try:
            self.get(0)
        except TimeoutError:
            return False
        except BaseException:  # noqa: BLE001 - an error is a result too
            pass
        return True

    def add_done_callback(self, fn: Callable[["Future[T]"], None]) -> None:
        """Calls ``fn(self)`` once the result is there, on a runtime thread
        (or at once on this thread if it already is). Keep it short."""
        if self._done:
            fn(self)
        else:
            self._on_done(lambda: fn(self))

    def __await__(self) -> Generator[Any, None, T]:
        if not self._done:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not waiter.done():
                    waiter.set_result(None)

            def on_done() -> None:
                try:
                    loop.call_soon_threadsafe(wake)
                except RuntimeError:  # the loop was closed meanwhile
                    pass

            self._on_done(on_done)
            yield from waiter.__await__()
        return self.get(0)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<castmesh.Future {state}>"


def gather(futures: List["Future[Any]"], combine: Callable[[List[Any]], T]) -> "Future[T]":
    """A future of ``combine([f.get() for f in futures])``: errors propagate
    (the first failing future's error, in order)."""
    import time

    def wait(timeout: Optional[float]) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        values = []
        for fut in futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            values.append(fut.get(left))
        return combine(values)

    def on_done(cb: Callable[[], None]) -> None:
        remaining = [len(futures)]
        lock = threading.Lock()
        if not futures:
            cb()
            return

        def one(_: Future[Any]) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                cb()

        for fut in futures:
            fut.add_done_callback(one)

    return Future(wait, on_done)



def in_thread(fn: Callable[[], T], name: str) -> "Future[T]":
    """Runs ``fn()`` on a new daemon thread; the future gives its result
    (or raises its exception)."""
    finished = threading.Event()
    lock = threading.Lock()
    outcome: List[Any] = [None, None]  # value, error
    callbacks: List[Callable[[], None]] = []

    def run() -> None:
        try:
            outcome[0] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the future's reader
            outcome[1] = error
        with lock:
            finished.set()
            ready, callbacks[:] = list(callbacks), []
        for cb in ready:
            cb()

    def wait(timeout: Optional[float]) -> T:
        if not finished.wait(timeout):
            raise TimeoutError(f"{name} did not finish within {timeout} s")
        if outcome[1] is not None:
            raise outcome[1]
        return outcome[0]

    def on_done(cb: Callable[[], None]) -> None:
        with lock:
            if not finished.is_set():
                callbacks.append(cb)
                return
        cb()

    threading.Thread(target=run, name=name, daemon=True).start()
    return Future(wait, on_done)
