"""Python actors: the :class:`Actor` base class and the :func:`endpoint` decorator."""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Dict, Generic, Optional, TypeVar, overload

from . import _context
from .shape import Point

__all__ = ["Actor", "endpoint", "EndpointDescriptor", "current_rank", "current_size"]

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

# How a call names a plain method made callable by castmesh.as_endpoint (its
# answer returned, or sent through an explicit response port).
AS_ENDPOINT = "castmesh.as_endpoint:"
AS_ENDPOINT_WITH_PORT = "castmesh.as_endpoint_port:"


class Actor:
    """Base class of Python actors.

    Subclass it, give ``__init__`` any (picklable) arguments, and mark the
    methods callers may invoke with :func:`endpoint` (plain or ``async def``).
    An instance lives in a worker proc on its own thread and handles one call
    at a time; spawn it with ``procs.spawn("name", MyActor, *args)``.
    """


class EndpointDescriptor(Generic[R]):
    """What :func:`endpoint` turns a method into.

    On an actor mesh (``counters.incr``) it gives the adverbs ``call``,
    ``call_one``, ``broadcast``, ``choose`` and ``stream``; inside the actor
    (``self.incr(...)``) it is the plain method.
    """

    def __init__(self, fn: Callable[..., R], explicit_response_port: bool = False) -> None:
        self.fn = fn
        self.name = fn.__name__
        # The method takes the caller's response port after self and answers
        # through it (castmesh.ports); its return value is ignored.
        self.explicit_response_port = explicit_response_port
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "EndpointDescriptor[R]": ...
    @overload
    def __get__(self, obj: object, objtype: Optional[type] = None) -> Callable[..., R]: ...

    def __get__(self, obj: Optional[object], objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self.fn, obj)

    def __repr__(self) -> str:
        return f"<castmesh endpoint {self.name}>"


def endpoint(fn: Optional[Callable[..., R]] = None, *, explicit_response_port: bool = False,
             propagate: Any = None) -> Any:
    """Marks an actor method (sync or ``async def``) as callable from other procs.

    Arguments and results are pickled (cloudpickle, so classes defined in
    ``__main__`` and closures work). An exception raised by the method is
    re-raised on the caller as :class:`castmesh.ActorError`; the actor keeps
    running.

    Used bare (``@endpoint``) or with options (``@endpoint(...)``):
    ``explicit_response_port=True`` passes the caller's response
    :class:`~castmesh.Port` as the first argument after ``self``; the method
    answers with ``port.send(value)`` (now or later, e.g. from another
    endpoint) and its return value is ignored. ``propagate`` is accepted for
    Monarch compatibility and must be None.
    """
    if propagate is not None:
        raise NotImplementedError("endpoint(propagate=...) is not supported by castmesh")
    if fn is None:
        return lambda method: EndpointDescriptor(method, explicit_response_port)
    return EndpointDescriptor(fn, explicit_response_port)


def current_rank() -> Point:
    """The calling actor's point in its mesh (``point.rank`` is its row-major
    position, ``point["gpus"]`` a coordinate). In the controller: rank 0 of a
    mesh with no dimensions."""
    ctx = _context.current()
    if ctx is None:
        return Point(0, {})
    return ctx.point


def current_size() -> Dict[str, int]:
    """Size of each dimension of the calling actor's mesh (``{}`` in the controller)."""
    ctx = _context.current()
    if ctx is None:
        return {}
    return dict(ctx.sizes)
