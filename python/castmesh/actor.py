"""Python actors: the :class:`Actor` base class and the :func:`endpoint` decorator."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import types
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, Generic, Optional, TypeVar, Union, overload

if sys.version_info >= (3, 10):
    from typing import Concatenate, Literal, ParamSpec, Protocol
else:  # typing_extensions: a dependency on Python 3.9 only (pyproject.toml)
    from typing import Literal, Protocol

    from typing_extensions import Concatenate, ParamSpec

from . import _context
from .shape import Point

if TYPE_CHECKING:
    from .future import Future
    from .actor_mesh import EndpointRef
    from .shape import Shape

__all__ = ["Actor", "endpoint", "concurrent_endpoint", "EndpointDescriptor", "current_rank", "current_size"]

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
# An endpoint's parameters after self: its mesh's adverbs take the same
# (``mesh.ping.call_one(1)`` is checked against ``def ping(self, n: int)``).
P = ParamSpec("P")
_Self = TypeVar("_Self")

if TYPE_CHECKING:
    class _SpawnedMesh:
        """How type checkers see a spawned mesh: ``procs.spawn(name, Cls)`` is
        typed as ``Cls`` (as Monarch's), so its endpoints are typed attributes;
        these are the ActorMesh methods it has besides them."""

        def slice(self: _Self, **selectors: Union[int, slice, range]) -> _Self: ...
        def stop(self, reason: str = "") -> "Future[None]": ...
        def flatten(self: _Self, name: str) -> _Self: ...
        def rename(self: _Self, **names: str) -> _Self: ...
        def split(self: _Self, **kwargs: Any) -> _Self: ...
        @property
        def shape(self) -> "Shape": ...
        @property
        def name(self) -> str: ...
        def __len__(self) -> int: ...

    _ActorBase = _SpawnedMesh
else:
    _ActorBase = object

# How a call names a plain method made callable by castmesh.as_endpoint (its
# answer returned, or sent through an explicit response port).
AS_ENDPOINT = "castmesh.as_endpoint:"
AS_ENDPOINT_WITH_PORT = "castmesh.as_endpoint_port:"
# How an Accumulator's call asks for its reply as a piece for the C++
# reducer <op> ("castmesh.reduce:<op>:<endpoint>"; python/src/py_reducers.h).
REDUCE_PREFIX = "castmesh.reduce:"


class Actor(_ActorBase):
    """Base class of Python actors.

    Subclass it, give ``__init__`` any (picklable) arguments, and mark the
    methods callers may invoke with :func:`endpoint` (plain or ``async def``).
    An instance lives in a worker proc on its own thread and handles one call
    at a time; spawn it with ``procs.spawn("name", MyActor, *args)``.
    """

    @property
    def logger(self) -> logging.Logger:
        """This actor's ``logging.Logger`` (``castmesh.actor.<Class>.<rank>``):
        every record it makes carries the actor's rank (``record.rank``) and
        point (``record.point``); with the procs' output forwarded
        (``ProcMesh.logging_option``) its lines reach the controller prefixed
        with the proc's point and host."""
        point = current_rank()
        logger = logging.getLogger(f"castmesh.actor.{type(self).__qualname__}.{point.rank}")
        if not any(isinstance(f, _RankFilter) for f in logger.filters):
            logger.addFilter(_RankFilter(point))
        return logger


class _RankFilter(logging.Filter):
    """Puts the actor's rank and point on each record of its logger."""

    def __init__(self, point: Point) -> None:
        super().__init__()
        self.point = point

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.point.rank
        record.point = self.point
        return True


class EndpointDescriptor(Generic[P, R]):
    """What :func:`endpoint` turns a method into.

    On an actor mesh (``counters.incr``) it gives the adverbs ``call``,
    ``call_one``, ``broadcast``, ``choose`` and ``stream``; inside the actor
    (``self.incr(...)``) it is the plain method.
    """

    def __init__(self, fn: Callable[..., Any], explicit_response_port: bool = False, concurrent: bool = False) -> None:
        self.fn = fn
        self.name = fn.__name__
        # The method takes the caller's response port after self and answers
        # through it (castmesh.ports); its return value is ignored.
        self.explicit_response_port = explicit_response_port
        # concurrent_endpoint: each call runs as a task on the actor's event
        # loop and the actor takes its next message at once.
        self.concurrent = concurrent
        # Monarch's endpoint options, kept as given (see endpoint()).
        self.propagate: Any = None
        self.instrument = False
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def answers_through_port(self) -> bool:
        """True when callers get the answer through a response port rather
        than the call's reply (explicit-response and concurrent endpoints:
        their reply only says the call was taken)."""
        return self.explicit_response_port or self.concurrent

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    # On an actor instance it is the plain method at run time; type checkers
    # see a mesh's endpoint there (spawn() is typed as the actor class), which
    # is also callable as the method is.
    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "EndpointDescriptor[P, R]": ...
    @overload
    def __get__(self, obj: object, objtype: Optional[type] = None) -> "EndpointRef[P, R]": ...

    def __get__(self, obj: Optional[object], objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self.fn, obj)

    def __repr__(self) -> str:
        return f"<castmesh endpoint {self.name}>"


class _EndpointDecorator(Protocol):
    """@endpoint(...) and @concurrent_endpoint(...): an ``async def``'s result is what it returns when awaited."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> EndpointDescriptor[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R]) -> EndpointDescriptor[P, R]: ...


class _PortEndpointDecorator(Protocol):
    """@endpoint(explicit_response_port=True): the port after self is not the callers' to pass."""

    def __call__(self, fn: Callable[Concatenate[Any, Any, P], Any]) -> EndpointDescriptor[P, Any]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> EndpointDescriptor[P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> EndpointDescriptor[P, R]: ...
@overload
def endpoint(fn: None = None, *, explicit_response_port: Literal[True], propagate: Any = None,
             instrument: bool = False) -> _PortEndpointDecorator: ...
@overload
def endpoint(fn: None = None, *, explicit_response_port: Literal[False] = False, propagate: Any = None,
             instrument: bool = False) -> _EndpointDecorator: ...


def endpoint(fn: Optional[Callable[..., Any]] = None, *, explicit_response_port: bool = False,
             propagate: Any = None, instrument: bool = False) -> Any:
    """Marks an actor method (sync or ``async def``) as callable from other procs.

    Arguments and results are pickled (cloudpickle, so classes defined in
    ``__main__`` and closures work). An exception raised by the method is
    re-raised on the caller as :class:`castmesh.ActorError`; the actor keeps
    running.

    Used bare (``@endpoint``) or with options (``@endpoint(...)``):
    ``explicit_response_port=True`` passes the caller's response
    :class:`~castmesh.Port` as the first argument after ``self``; the method
    answers with ``port.send(value)`` (now or later, e.g. from another
    endpoint) and its return value is ignored. ``propagate`` and
    ``instrument`` are accepted as Monarch takes them and kept on the endpoint
    (``.propagate``, ``.instrument``): Monarch's propagators describe results
    to its tensor engine, and castmesh has no per-endpoint telemetry, so
    neither changes how a call runs.
    """
    def wrap(method: Callable[..., Any]) -> EndpointDescriptor[Any, Any]:
        descriptor: EndpointDescriptor[Any, Any] = EndpointDescriptor(method, explicit_response_port)
        descriptor.propagate, descriptor.instrument = propagate, instrument
        return descriptor

    return wrap if fn is None else wrap(fn)


@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> EndpointDescriptor[P, R]: ...
@overload
def concurrent_endpoint(fn: None = None, *, explicit_response_port: Literal[True], propagate: Any = None,
                        instrument: bool = True) -> _PortEndpointDecorator: ...
@overload
def concurrent_endpoint(fn: None = None, *, explicit_response_port: Literal[False] = False, propagate: Any = None,
                        instrument: bool = True) -> _EndpointDecorator: ...


def concurrent_endpoint(fn: Optional[Callable[..., Any]] = None, *, explicit_response_port: bool = False,
                        propagate: Any = None, instrument: bool = True) -> Any:
    """Marks an ``async def`` actor method as an endpoint whose calls may
    interleave (Monarch's ``concurrent_endpoint``; options as :func:`endpoint`).

    Each call runs as a task on the actor's event loop and the actor takes
    its next message at once, so while one call awaits, other calls (of
    this or any other endpoint) run. Calls from one sender start in the order
    sent; each runs up to its first ``await`` before the next one starts.
    An actor with a concurrent endpoint runs all its Python code (the
    constructor, every endpoint, ``__supervise__``, ``__cleanup__``) on that
    loop's thread, so calls interleave only at ``await``.

    An ``Exception`` raised by the method goes to the caller (as
    :class:`castmesh.ActorError`) and the actor keeps running; with
    ``explicit_response_port=True`` the method must forward errors itself
    (``port.exception(e)``), and one it lets escape fails the actor, as does
    a ``BaseException`` that is not an ``Exception`` (a caller still waiting
    for the call's answer gets that error as an ActorError). Calls still running
    when the actor stops are cancelled and awaited before its
    ``__cleanup__`` runs. ``instrument`` is accepted for Monarch
    compatibility, as is ``propagate`` (see :func:`endpoint`). Raises
    ValueError for a method that is not ``async def``.
    """

    def wrap(method: Callable[..., Any]) -> EndpointDescriptor[Any, Any]:
        if isinstance(method, EndpointDescriptor):
            raise ValueError("concurrent_endpoint does not wrap @endpoint; pass endpoint options to "
                             "@concurrent_endpoint")
        if not inspect.iscoroutinefunction(method):
            raise ValueError(f"concurrent_endpoint can only wrap async endpoints, {method!r} is not 'async def'")
        descriptor: EndpointDescriptor[Any, Any] = EndpointDescriptor(method, explicit_response_port, concurrent=True)
        descriptor.propagate, descriptor.instrument = propagate, instrument
        return descriptor

    return wrap if fn is None else wrap(fn)


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
