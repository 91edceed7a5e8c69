"""Worker side of a Python actor: ``castmesh.PyActorHost`` (C++, one
dedicated thread per actor) creates one ActorHost and hands it every call.

A call's reply is ``dumps(("ok", value))`` or ``dumps(("err", (type name,
message, formatted traceback, pickled exception or None)))``; an endpoint
that raises does not stop its actor.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import traceback
from typing import Any, Optional, Tuple

from . import _context, _serial
from .errors import ActorError


def _error_reply(error: BaseException) -> bytes:
    kind = type(error)
    type_name = f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(kind, error, error.__traceback__))
    try:
        exc_bytes: Optional[bytes] = _serial.dumps(error)
    except Exception:  # noqa: BLE001 - the exception itself may not pickle
        exc_bytes = None
    return _serial.dumps(("err", (type_name, str(error), text, exc_bytes)))


class ActorHost:
    """Holds one Python actor instance and dispatches calls to its endpoints."""

    def __init__(self, spec: bytes, address: str, index: int) -> None:
        self._address = address
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._instance: Any = None
        self._init_error: Optional[bytes] = None
        self._context: Optional[_context.ActorContext] = None
        self._endpoints: dict = {}
        try:
            cls, args, kwargs, name, shape, base_rank_to_position = _serial.loads(spec)
            from .shape import Point

            position = base_rank_to_position.get(index, index)
            point = shape.point(position)
            self._context = _context.ActorContext(
                Point(point.rank, point.coords, point.base_rank), shape.sizes, name, address, index
            )
            _context.set_current(self._context)
            self._instance = cls(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - reported to every caller
            self._init_error = _error_reply(error)

    def handle(self, endpoint: str, payload: memoryview, oneway: bool = False) -> bytes:
        """Runs one endpoint call; never raises (errors become the reply).

        ``oneway`` calls (broadcast) have no caller to raise to: their errors
        are printed to the worker's stderr, naming the actor."""
        if self._init_error is not None:
            if oneway:
                self._report(endpoint, self._init_error)
            return self._init_error
        # Set per call: the host may be created on another thread than the
        # one that runs its calls.
        _context.set_current(self._context)
        try:
            args, kwargs = _serial.loads(payload)
            method = self._endpoint(endpoint)
            result = method(self._instance, *args, **kwargs)
            if inspect.isawaitable(result):
                result = self._event_loop().run_until_complete(result)
            return _serial.dumps(("ok", result))
        except BaseException as error:  # noqa: BLE001 - every failure goes back to the caller
            reply = _error_reply(error)
            if oneway:
                self._report(endpoint, reply)
            return reply

    def _report(self, endpoint: str, reply: bytes) -> None:
        _, (type_name, message, text, _) = _serial.loads(reply)
        print(f"castmesh: actor {self._address}: broadcast {endpoint}() raised {type_name}: {message}\n{text}",
              file=sys.stderr, flush=True)

    def _endpoint(self, name: str) -> Any:
        fn = self._endpoints.get(name)
        if fn is None:
            from .actor import EndpointDescriptor

            attr = inspect.getattr_static(type(self._instance), name, None)
            if not isinstance(attr, EndpointDescriptor):
                raise AttributeError(f"{type(self._instance).__qualname__} has no endpoint {name!r}")
            fn = self._endpoints[name] = attr.fn
        return fn

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        # One loop per actor, on the actor's own thread: async endpoints run to
        # completion one at a time, like sync ones.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def close(self) -> None:
        """The actor stopped: close its loop and flush output."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._instance = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass


def decode_reply(data: bytes, actor: str) -> Tuple[bool, Any]:
    """(True, value) or (False, ActorError) from a reply built by ActorHost."""
    kind, body = _serial.loads(data)
    if kind == "ok":
        return True, body
    type_name, message, text, exc_bytes = body
    exception = None
    if exc_bytes is not None:
        try:
            exception = _serial.loads(exc_bytes)
        except Exception:  # noqa: BLE001 - its class may not exist here
            exception = None
    return False, ActorError(type_name, message, text, actor, exception)
