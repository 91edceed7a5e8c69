"""Meshes of actors and the adverbs of their endpoints.

``procs.spawn("name", Cls, *args)`` puts one ``Cls`` on each proc (served by
the C++ actor ``castmesh.PyActorServer``, castmesh._actor_server);
``mesh.endpoint.call(...)`` etc. send the pickled call over castmesh's
transport.

Adverbs (on every endpoint of an :class:`ActorMesh`):
  * ``call(*a, **kw)``      -> Future[ValueMesh]: every actor, one value per point
  * ``call_one(*a, **kw)``  -> Future[value]: the mesh must hold one actor
  * ``broadcast(*a, **kw)`` -> None: every actor, no reply (fire and forget)
  * ``choose(*a, **kw)``    -> Future[value]: one actor, the one with the fewest
                               choose() requests in flight (load balancing)
  * ``stream(*a, **kw)``    -> ResultStream: one Future per actor, in the
                               order the results arrive (``.values()``: the values)
"""

from __future__ import annotations

import builtins
import inspect
import operator
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from . import _castmesh, _context, _serial, supervision
from ._replies import decode_reply, piece_values
from .actor import AS_ENDPOINT, AS_ENDPOINT_WITH_PORT, REDUCE_PREFIX, Actor, EndpointDescriptor, P
from .errors import ProcError, with_context
from .future import Future, gather, in_thread
from .ports import PORT_KWARG, Channel
from .shape import MeshShapeOps, Shape, ValueMesh, shape_to_plain

if TYPE_CHECKING:
    from .proc_mesh import ProcMesh

__all__ = ["ActorMesh", "EndpointRef", "Endpoint", "Accumulator", "as_endpoint", "ResultStream"]

A = TypeVar("A", bound=Actor)
R = TypeVar("R")
T = TypeVar("T")


def _call_future(ref: "_castmesh.ActorRef", endpoint: str, payload: bytes,
                 slot: Optional["_castmesh.CallFuture"] = None, token: Optional[int] = None) -> Future[Any]:
    """The Future of one request to one actor (sent now unless `slot`
    is the pending answer of a request already sent)."""
    if slot is None:
        slot = ref.ask(endpoint, payload)

    def wait(timeout: Optional[float]) -> Any:
        data = _wait_slot(slot, timeout, f"answer from {ref.address}", endpoint, ref.address, token)
        ok, value = decode_reply(data, ref.address)
        if ok:
            return value
        raise value

    return Future(wait, slot.add_callback)


# How long a call that found a member gone waits for that member's failure
# report to explain it (docs/python.md); a stopped member has none.
_FAILURE_REPORT_WAIT_S = 5.0
# The codes of a call to a member that died: its proc is gone (UNAVAILABLE), or
# the member itself is (NOT_FOUND: the call reached its proc after the actor
# failed, e.g. in its constructor, and before that failure's report reached us).
_MEMBER_GONE_CODES = ("UNAVAILABLE", "NOT_FOUND")


def _wait_slot(slot: Any, timeout: Optional[float], awaited: str, endpoint: str, target: str,
               token: Optional[int] = None) -> Any:
    """Waits for a request slot; its data, or TimeoutError / ProcError naming
    the request (and the failures seen of the mesh `token`, which say why
    members are dead)."""
    try:
        data = slot.wait(-1.0 if timeout is None else timeout)
    except ProcError as failed:
        # A failed member's report follows its calls' errors closely: wait a moment for it
        # (on a loaded machine the report came over 2 s after the call's error).
        failures = supervision.wait_for_failures(
            token, _FAILURE_REPORT_WAIT_S if failed.code in _MEMBER_GONE_CODES else 0)
        # A call to one member is explained by that member's failure only (it may have been stopped).
        if not target.startswith("<"):
            failures = [failure for failure in failures if failure.actor == target]
        why = supervision.summary(failures) if failures else str(failed)
        reason = supervision.stop_reason(token)
        if reason and not failures:
            why += f" (the mesh was stopped: {reason})"
        error = ProcError(f"call {endpoint}() to {target} failed: {failed.code}: {why}", failed.code)
        error.endpoint = endpoint
        raise error from None
    if data is None:
        raise TimeoutError(f"{endpoint}() got no {awaited} within {timeout} s")
    return data


class EndpointRef(Generic[P, R]):
    """An endpoint of an actor mesh; call it through its adverbs, which take
    the endpoint method's arguments (after self; type checkers check them)."""

    __slots__ = ("_mesh", "_name", "_explicit")

    def __init__(self, mesh: "ActorMesh[Any]", name: str, explicit: Optional[bool] = None) -> None:
        self._mesh = mesh
        self._name = name  # what calls name (as_endpoint's carry a prefix)
        # @endpoint(explicit_response_port=True): answers come through a port.
        if explicit is None:
            attr = inspect.getattr_static(mesh._cls, name, None)
            explicit = bool(getattr(attr, "answers_through_port", False))
        self._explicit = explicit

    def _payload(self, args: tuple, kwargs: dict) -> bytes:
        """The pickled call; to a slice, with the slice's shape (each member's
        ``context().message_rank`` is its point there)."""
        mesh = self._mesh
        if not mesh._whole:
            kwargs = {**kwargs, _context.MESSAGE_SHAPE_KWARG: mesh._plain_shape()}
        return _serial.dumps((args, kwargs))

    def _with_port(self, args: tuple, kwargs: dict) -> Any:
        """For an explicit-response endpoint: a channel opened here, and the
        payload that hands its port to every actor called."""
        port, receiver = Channel.open()
        return receiver, self._payload(args, {**kwargs, PORT_KWARG: port.address})

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Calls every actor of the mesh; the future gives a ValueMesh of the results.

        Any failing actor makes the whole future fail with its error (the
        first in mesh order)."""
        if not self._explicit:
            return self._call(self._payload(args, kwargs))
        receiver, payload = self._with_port(args, kwargs)
        shape = self._mesh.shape
        positions = {rank: position for position, rank in enumerate(shape.ranks)}
        answers = [receiver.recv_ranked() for _ in range(len(shape))]

        def combine(values: List[Any]) -> ValueMesh[R]:
            ordered: List[Any] = [None] * len(shape)
            for rank, value in values[1:]:
                ordered[positions[rank]] = value
            return ValueMesh(shape, ordered)

        # The handlers' own replies first: a member that is dead or raised
        # fails the future instead of leaving its answer missing.
        return gather([self._call(payload)] + answers, combine)

    def _call(self, payload: bytes) -> Future[ValueMesh[R]]:
        return self._mesh._route.call(self._mesh, self._name, payload)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Calls the one actor of a single-actor mesh (e.g. ``mesh.slice(gpus=0)``)."""
        mesh = self._mesh
        if len(mesh) != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one actor, this one has {len(mesh)} "
                f"({mesh.shape}); slice it first or use call()"
            )
        if not self._explicit:
            return mesh._route.call_one(mesh, self._name, self._payload(args, kwargs))
        receiver, payload = self._with_port(args, kwargs)
        return gather([mesh._route.call_one(mesh, self._name, payload), receiver.recv()], lambda values: values[1])

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Sends the call to every actor without waiting for (or getting) replies.

        Calls from one sender reach each actor in the order they were made.
        Errors are reported by the actor's proc, not to the sender."""
        self._cast(self._payload(args, kwargs))

    def _send(self, args: tuple, kwargs: dict, port: Any) -> None:
        """castmesh.send: a broadcast whose answers go to `port` (if any)."""
        if port is not None:
            kwargs = {**kwargs, PORT_KWARG: port.address}
        self._cast(self._payload(args, kwargs))

    def _cast(self, payload: bytes) -> None:
        self._mesh._route.cast(self._mesh, self._name, payload)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Calls one actor of the mesh (load balancing, as the C++
        ``ActorMesh::choose``): the one with the fewest ``choose()`` requests
        from this process in flight (counted over the whole mesh, whichever
        slice chose); among equals, the next one round-robin (C++ breaks
        ties at random)."""
        mesh = self._mesh
        in_flight = mesh._in_flight
        ranks = mesh.shape.ranks
        position = in_flight.start_least_loaded(ranks)
        try:
            future = self._on_member(position).call_one(*args, **kwargs)
        except BaseException:
            in_flight.finished(ranks[position])
            raise
        future.add_done_callback(lambda _: in_flight.finished(ranks[position]))
        return future

    def _chosen(self) -> "EndpointRef[P, R]":
        """This endpoint on the member choose() would call now (not counted
        as in flight: ``send(..., selection="choose")`` waits for no reply)."""
        return self._on_member(self._mesh._in_flight.least_loaded(self._mesh.shape.ranks))

    def _on_member(self, position: int) -> "EndpointRef[P, R]":
        """This endpoint on the member at row-major `position`: its slice, so
        a call takes the same route as every other adverb and stays ordered
        after broadcasts."""
        mesh = self._mesh
        one = mesh.slice(**mesh.shape.point(position).coords)
        return EndpointRef(one, self._name, self._explicit)

    def stream(self, *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> "ResultStream[R]":
        """Calls every actor now and gives one :class:`Future` per actor, in
        the order the results arrive (Monarch's ``stream``): the k-th future
        yielded holds the k-th result to arrive (``.get()`` or ``await``).
        Iterating does not wait; the futures do. ``ResultStream.values()``
        gives the values themselves (``for`` or ``async for``). ``timeout``
        bounds the wait for each next result: past it, the futures of the
        results still missing raise ``TimeoutError``."""
        if self._explicit:
            receiver, payload = self._with_port(args, kwargs)
            return ResultStream(len(self._mesh), self._port_results(self._call(payload), receiver), timeout)
        return self._mesh._route.stream(self._mesh, self._name, self._payload(args, kwargs), timeout)

    def _port_results(self, handled: Future[Any], receiver: Any) -> Callable[[Optional[float]], Any]:
        """next(timeout) -> (ok, value) of each explicit-response answer."""
        state = {"handled": False}

        def next_result(timeout: Optional[float]) -> Tuple[bool, Any]:
            if not state["handled"]:
                handled.get(timeout)  # every handler took the call (or its error is raised)
                state["handled"] = True
            try:
                return True, receiver.recv().get(timeout)
            except TimeoutError:
                raise TimeoutError(f"no further result of {self._name}() within {timeout} s") from None
            except Exception as error:  # noqa: BLE001 - that member's answer was an error
                return False, error

        return next_result

    def __repr__(self) -> str:
        return f"<endpoint {self._name} of {self._mesh!r}>"

    if TYPE_CHECKING:
        # Inside the actor, ``self.ping(...)`` is the method itself (EndpointDescriptor.__get__).
        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


# Monarch's name for an endpoint of a mesh: the same class.
Endpoint = EndpointRef


class NotAnEndpoint:
    """A method of an actor mesh's class not marked ``@endpoint``: it has no
    adverbs, but :func:`as_endpoint` makes it callable."""

    __slots__ = ("_mesh", "_name")

    def __init__(self, mesh: "ActorMesh[Any]", name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(f"{self._mesh._cls.__qualname__} has no endpoint {self._name!r} (mark it with "
                             f"@endpoint, or call it through castmesh.as_endpoint)")

    def __repr__(self) -> str:
        return f"<method {self._name} of {self._mesh!r}, not an endpoint>"


def as_endpoint(method: NotAnEndpoint, *, propagate: Any = None,
                explicit_response_port: bool = False) -> "EndpointRef[..., Any]":
    """An endpoint for a method not marked ``@endpoint`` (``as_endpoint(mesh.method)``),
    with every adverb; ``explicit_response_port=True``: the method takes the
    response port first, as ``@endpoint(explicit_response_port=True)``."""
    if propagate is not None:
        raise NotImplementedError("as_endpoint(propagate=...) is not supported by castmesh")
    if not isinstance(method, NotAnEndpoint):
        raise ValueError(f"as_endpoint needs a method of an actor mesh that is not an endpoint, got {method!r}")
    prefix = AS_ENDPOINT_WITH_PORT if explicit_response_port else AS_ENDPOINT
    return EndpointRef(method._mesh, prefix + method._name, explicit_response_port)


# Python functions an Accumulator recognises, and the C++ reducer that
# folds their values on the way up the cast tree (python/src/py_reducers.h).
_KNOWN_REDUCERS: Dict[Any, str] = {operator.add: "sum", builtins.min: "min", builtins.max: "max"}


class Accumulator(Generic[R, T]):
    """Folds the results of an endpoint over a mesh (Monarch's
    Accumulator): ``Accumulator(mesh.value, 0, operator.add)
    .accumulate(*args)`` is a Future of ``combine(...combine(identity, v0)...)``
    over every actor's result (``combine`` should not care about order:
    castmesh folds in no particular one).

    Where ``combine`` is a reducer castmesh knows (``operator.add``, the
    builtins ``min`` and ``max``) and the mesh was spawned here, C++ relays
    fold the numbers (exact ``int`` within int64, ``float``) on the way up
    the cast tree, and only the folded number (plus any value of another
    type, or error, which the caller folds with ``combine``) reaches the
    caller; :attr:`reducer` names that C++ reducer. Otherwise every result
    comes back and the caller folds them as they arrive. Both give the same
    value, up to floating-point rounding (float additions in another order).
    """

    def __init__(self, endpoint: "EndpointRef[..., R]", identity: T, combine: Callable[[T, R], T]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    @property
    def reducer(self) -> Optional[str]:
        """The C++ reducer that folds in the cast tree ("sum", "min",
        "max"), or None when the caller folds every result."""
        try:
            op = _KNOWN_REDUCERS.get(self._combine)
        except TypeError:  # an unhashable callable
            return None
        endpoint = self._endpoint
        if op is None or endpoint._explicit or not endpoint._mesh._route.folds:
            return None
        return op

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[T]:
        """Calls every actor now; the future gives the folded value."""
        op = self.reducer
        if op is not None:
            return self._accumulate_in_tree(op, args, kwargs)
        stream = self._endpoint.stream(*args, **kwargs)

        def fold() -> T:
            value = self._identity
            for result in stream.values():
                value = self._combine(value, result)
            return value

        return in_thread(fold, f"castmesh-accumulate-{self._endpoint._name}")

    def _accumulate_in_tree(self, op: str, args: tuple, kwargs: dict) -> Future[T]:
        endpoint = self._endpoint
        mesh = endpoint._mesh
        name = f"{REDUCE_PREFIX}{op}:{endpoint._name}"
        slot = mesh._route.call_reduce(name, endpoint._payload(args, kwargs), op)

        def wait(timeout: Optional[float]) -> T:
            piece = _wait_slot(slot, timeout, f"folded answer from {mesh!r}", endpoint._name, repr(mesh),
                               mesh._token)
            value = self._identity
            for ok, item in piece_values(piece, repr(mesh)):
                if not ok:
                    raise item
                value = self._combine(value, item)
            return value

        return Future(wait, slot.add_callback)


class ResultStream(Generic[R]):
    """What :meth:`EndpointRef.stream` returns: one :class:`Future` per
    member called, yielded in the order the results arrive (Monarch's
    stream). The requests are already sent when the stream is made.

    ``for f in stream`` yields the futures at once (they wait, not the loop):
    ``f.get()`` or ``await f`` gives the k-th result to arrive, or raises that
    member's error (the other results can still be read). :meth:`values`
    gives the values instead, for ``for`` or ``async for``.
    """

    __slots__ = ("_count", "_yielded", "_lock", "_cond", "_arrived", "_error", "_callbacks", "_next_result",
                 "_timeout", "_pumping")

    def __init__(self, count: int, next_result: Callable[[Optional[float]], Tuple[bool, Any]],
                 timeout: Optional[float] = None) -> None:
        # next_result(timeout) -> (ok, value | error): the next result to
        # arrive, pulled by one pump thread (started at the first wait).
        self._count = count
        self._yielded = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._arrived: List[Tuple[bool, Any]] = []
        self._error: Optional[BaseException] = None  # the stream itself failed: the missing results raise it
        self._callbacks: List[Tuple[int, Callable[[], None]]] = []
        self._next_result = next_result
        self._timeout = timeout
        self._pumping = False

    @classmethod
    def of_futures(cls, futures: List[Future[Any]], name: str,
                   timeout: Optional[float] = None) -> "ResultStream[Any]":
        """A stream of the results of `futures` (calls of the endpoint
        `name`), in completion order."""
        arrived: "queue.SimpleQueue[Tuple[bool, Any]]" = queue.SimpleQueue()

        def on_done(fut: Future[Any]) -> None:
            error = fut.exception(0)
            arrived.put((True, fut.get(0)) if error is None else (False, error))

        for fut in futures:
            fut.add_done_callback(on_done)

        def next_result(wait: Optional[float]) -> Tuple[bool, Any]:
            try:
                return arrived.get(timeout=wait)
            except queue.Empty:
                raise TimeoutError(f"no further result of {name}() within {wait} s") from None

        return cls(len(futures), next_result, timeout)

    def _arrive(self, outcome: Tuple[bool, Any]) -> None:
        with self._cond:
            self._arrived.append(outcome)
            self._cond.notify_all()
        self._fire()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()
        self._fire()

    def _fire(self) -> None:
        """Runs the callbacks of the futures whose result is now known."""
        with self._lock:
            ready = [cb for index, cb in self._callbacks if index < len(self._arrived) or self._error is not None]
            self._callbacks = [(index, cb) for index, cb in self._callbacks
                               if not (index < len(self._arrived) or self._error is not None)]
        for cb in ready:
            cb()

    def _start_pump(self) -> None:
        """Pulls every result of a pulled source on a daemon thread (once)."""
        with self._lock:
            if self._pumping:
                return
            self._pumping = True
        next_result, count, timeout = self._next_result, self._count, self._timeout

        def pump() -> None:
            for _ in range(count):
                try:
                    outcome = next_result(timeout)
                except BaseException as error:  # noqa: BLE001 - the missing results raise it
                    self._fail(error)
                    return
                self._arrive(outcome)

        threading.Thread(target=pump, name="castmesh-stream", daemon=True).start()

    def _future(self, index: int) -> Future[R]:
        """The future of the `index`-th result to arrive."""

        def wait(timeout: Optional[float]) -> R:
            self._start_pump()
            with self._cond:
                if not self._cond.wait_for(lambda: index < len(self._arrived) or self._error is not None, timeout):
                    raise TimeoutError(f"result {index + 1} of {self._count} did not arrive within {timeout} s")
                if index < len(self._arrived):
                    ok, value = self._arrived[index]
                else:
                    ok, value = False, self._error
            if ok:
                return value
            raise value

        def on_done(cb: Callable[[], None]) -> None:
            self._start_pump()
            with self._lock:
                if not (index < len(self._arrived) or self._error is not None):
                    self._callbacks.append((index, cb))
                    return
            cb()

        return Future(wait, on_done)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> "ResultStream[R]":
        return self

    def __next__(self) -> Future[R]:
        if self._yielded >= self._count:
            raise StopIteration
        self._yielded += 1
        return self._future(self._yielded - 1)

    def values(self) -> "_StreamValues[R]":
        """The results themselves, in arrival order: ``for v in
        s.values()`` (blocks, GIL released) or ``async for v in s.values()``
        (the loop keeps running). A member's error is raised when its result
        is reached."""
        return _StreamValues(self)


class _StreamValues(Generic[R]):
    """The values of a :class:`ResultStream` (its futures, waited for in turn)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: ResultStream[R]) -> None:
        self._stream = stream

    def __iter__(self) -> "_StreamValues[R]":
        return self

    def __next__(self) -> R:
        return next(self._stream).get()

    def __aiter__(self) -> "_StreamValues[R]":
        return self

    async def __anext__(self) -> R:
        try:
            fut = next(self._stream)
        except StopIteration:
            raise StopAsyncIteration from None
        return await fut


class _DirectRoute:
    """How an :class:`ActorMesh` reaches its members when it has no C++
    mesh (one unpickled here, spawned with ``this_proc()``, or sliced by
    names the C++ mesh does not know): each adverb messages every member's
    ref itself. Stateless; one instance, ``_DIRECT``."""

    folds = False  # no cast tree to fold reply pieces in (Accumulator folds in the caller)

    def select(self, shape: Shape, resolved: List[Any], sub_shape: Shape) -> "_Route":
        """The route of the slice `resolved` of a mesh shaped `shape`."""
        return self

    def call(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> Future[ValueMesh[Any]]:
        futures = [_call_future(ref, endpoint, payload) for ref in mesh._ordered_refs()]
        shape = mesh.shape
        return gather(futures, lambda values: ValueMesh(shape, values))

    def call_one(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> Future[Any]:
        return _call_future(mesh._ordered_refs()[0], endpoint, payload, token=mesh._token)

    def cast(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> None:
        for ref in mesh._ordered_refs():
            ref.tell(endpoint, payload)

    def stream(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes,
               timeout: Optional[float]) -> "ResultStream[Any]":
        futures = [_call_future(ref, endpoint, payload) for ref in mesh._ordered_refs()]
        return ResultStream.of_futures(futures, endpoint, timeout)

    def call_reduce(self, endpoint: str, payload: bytes, op: str) -> Any:
        raise AssertionError("a direct route has no cast tree to fold in (folds is False)")

    def stop(self, mesh: "ActorMesh[Any]") -> None:
        for ref in mesh._ordered_refs():
            ref.stop()


class _TreeRoute:
    """How an :class:`ActorMesh` this process spawned on a ProcMesh reaches
    its members: through its C++ castmesh::ActorMesh (cast tree,
    supervision), so calls from one sender reach each member in order
    whatever the adverb, and a call including a dead member fails at once.
    The C++ mesh answers in its ascending rank order; the Python shape may
    reverse dimensions, and the replies are reordered to match it."""

    __slots__ = ("_cmesh", "_labels")
    folds = True  # C++ reducers fold numeric reply pieces on the way up

    def __init__(self, cmesh: "_castmesh.ActorMeshHandle", labels: List[str]) -> None:
        self._cmesh = cmesh
        # The dimension names the C++ view knows (flatten, rename and split
        # change only the Python view).
        self._labels = labels

    def select(self, shape: Shape, resolved: List[Any], sub_shape: Shape) -> "_Route":
        """The route of the slice `resolved` of a mesh shaped `shape`: the
        C++ mesh sliced alike, or the direct route when `shape`'s names are
        not the C++ view's."""
        if self._labels != shape.labels:
            return _DIRECT
        cmesh = self._cmesh
        for name, sel, _ in resolved:
            cmesh = cmesh.select_index(name, sel) if isinstance(sel, int) else cmesh.select_range(name, *sel)
        return _TreeRoute(cmesh, sub_shape.labels)

    def call(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> Future[ValueMesh[Any]]:
        slot = self._cmesh.call(endpoint, payload)

        def wait(timeout: Optional[float]) -> Any:
            data = _wait_slot(slot, timeout, f"complete answer from {mesh!r}", endpoint, repr(mesh), mesh._token)
            by_rank = dict(zip(mesh.shape.ascending_ranks, data))
            values = []
            for ref, reply in zip(mesh._ordered_refs(), (by_rank[rank] for rank in mesh.shape.ranks)):
                ok, value = decode_reply(reply, ref.address)
                if not ok:
                    raise value
                values.append(value)
            return ValueMesh(mesh.shape, values)

        return Future(wait, slot.add_callback)

    def call_one(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> Future[Any]:
        return _call_future(mesh._ordered_refs()[0], endpoint, b"", slot=self._cmesh.call_one(endpoint, payload),
                            token=mesh._token)

    def cast(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes) -> None:
        try:
            self._cmesh.cast(endpoint, payload)
        except ProcError as error:
            raise with_context(error, f"broadcast {endpoint}() to {mesh!r} failed") from None

    def stream(self, mesh: "ActorMesh[Any]", endpoint: str, payload: bytes,
               timeout: Optional[float]) -> "ResultStream[Any]":
        stream = self._cmesh.stream(endpoint, payload)
        refs = mesh._refs_in_cmesh_order()

        def next_result(wait: Optional[float]) -> Tuple[bool, Any]:
            try:
                kind, position, data = stream.next(-1.0 if wait is None else wait)
            except ProcError as error:
                raise with_context(error, f"stream {endpoint}() to {mesh!r} failed") from None
            if kind == "timeout":
                raise TimeoutError(f"no further result of {endpoint}() within {wait} s")
            if kind == "end":
                raise ProcError(f"stream {endpoint}() to {mesh!r} ended early")
            if kind == "failed":  # that member's answer: the others' still come
                code, message = data
                return False, ProcError(f"stream {endpoint}() to {refs[position].address} failed: {code}: {message}",
                                        code)
            return decode_reply(data, refs[position].address)

        return ResultStream(len(mesh), next_result, timeout)

    def call_reduce(self, endpoint: str, payload: bytes, op: str) -> "_castmesh.CallFuture":
        """The slot of one reply piece folded by the C++ reducer `op`."""
        return self._cmesh.call_reduce(endpoint, payload, op)

    def stop(self, mesh: "ActorMesh[Any]") -> None:
        if len(mesh.shape) == len(mesh._refs):
            self._cmesh.stop()
        else:  # a slice: the C++ mesh stops whole meshes only
            for ref in mesh._ordered_refs():
                ref.stop()


_Route = Union[_DirectRoute, _TreeRoute]
_DIRECT = _DirectRoute()


class _InFlight:
    """The ``choose()`` requests in flight to each member of a mesh, by base
    rank; shared by the mesh's slices and reshapes (as the C++ mesh's counts
    are). Thread-safe: answers arrive on runtime threads."""

    __slots__ = ("_lock", "_counts", "_next")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[int, int] = {}
        self._next = 0  # where the search for a least loaded member starts (ties go round-robin)

    def _least_loaded(self, ranks: List[int]) -> int:
        counts = [self._counts.get(rank, 0) for rank in ranks]
        fewest = min(counts)
        start = self._next % len(ranks)
        position = next(p % len(ranks) for p in range(start, start + len(ranks)) if counts[p % len(ranks)] == fewest)
        self._next = position + 1
        return position

    def least_loaded(self, ranks: List[int]) -> int:
        """The position in `ranks` of a member with the fewest requests in
        flight; among equals, the next one round-robin (so idle members
        share the calls evenly, as castmesh's choose() always did)."""
        with self._lock:
            return self._least_loaded(ranks)

    def start_least_loaded(self, ranks: List[int]) -> int:
        """least_loaded, counting one more request in flight to that member."""
        with self._lock:
            position = self._least_loaded(ranks)
            self._counts[ranks[position]] = self._counts.get(ranks[position], 0) + 1
            return position

    def finished(self, rank: int) -> None:
        """A request to the member `rank` got its answer (or error)."""
        with self._lock:
            left = self._counts[rank] - 1
            if left:
                self._counts[rank] = left
            else:
                del self._counts[rank]


class ActorMesh(MeshShapeOps, Generic[A]):
    """One actor of a class per point of a shape (the result of ``procs.spawn``).

    Endpoints are attributes (``mesh.incr.broadcast(2)``); ``slice(gpus=1)``
    gives a sub-mesh without copying anything. Picklable: pass it to other
    actors and call it from there.
    """

    def __init__(self, cls: Type[A], name: str, refs: Dict[int, "_castmesh.ActorRef"], shape: Shape,
                 proc_mesh: Optional["ProcMesh"] = None, route: Optional["_Route"] = None) -> None:
        # route: how the adverbs reach the members (_TreeRoute: the C++
        # castmesh::ActorMesh of a mesh this process spawned on a ProcMesh;
        # default _DirectRoute: meshes unpickled elsewhere or spawned with
        # this_proc() talk to the refs).
        self._route: _Route = route or _DIRECT
        self._cls = cls
        self._name = name
        self._refs = refs  # base rank -> ref
        self._shape = shape
        self._proc_mesh = proc_mesh
        self._ordered: Optional[List["_castmesh.ActorRef"]] = None
        # The mesh as spawned (False: a slice or reshape, whose calls carry its
        # shape as plain data, made once: _plain_shape).
        self._whole = True
        self._plain: Optional[Tuple[Any, ...]] = None
        self._in_flight = _InFlight()  # choose()'s load, shared with slices and reshapes
        # Supervision record of a mesh this process spawned (None elsewhere),
        # and each base rank's position in the mesh as spawned.
        self._token: Optional[int] = None
        self._base_position: Dict[int, int] = {}
        # The endpoints looked up on this mesh (__getattr__), by name.
        self._endpoint_refs: Dict[str, "EndpointRef[..., Any]"] = {}

    @property
    def shape(self) -> Shape:
        """The mesh's shape (named dimensions)."""
        return self._shape

    def _with_shape(self, shape: Shape) -> "ActorMesh[A]":
        """The same members (same order) under another shape."""
        mesh = ActorMesh(self._cls, self._name, self._refs, shape, self._proc_mesh, self._route)
        mesh._token, mesh._base_position = self._token, self._base_position
        mesh._in_flight = self._in_flight
        mesh._whole = False
        return mesh

    @property
    def name(self) -> str:
        return self._name

    def _plain_shape(self) -> Tuple[Any, ...]:
        """The shape as a call to this slice carries it (shape_to_plain)."""
        if self._plain is None:
            self._plain = shape_to_plain(self._shape)
        return self._plain

    def __len__(self) -> int:
        return len(self._shape)

    def _refs_in_cmesh_order(self) -> List["_castmesh.ActorRef"]:
        """The members in the order of the C++ mesh view (row-major over the
        ascending ranks; the Python shape may reverse dimensions)."""
        return [self._refs[rank] for rank in self._shape.ascending_ranks]

    def _ordered_refs(self) -> List["_castmesh.ActorRef"]:
        if self._ordered is None:
            self._ordered = [self._refs[rank] for rank in self._shape.ranks]
        return self._ordered

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        # An endpoint's ref is made once per mesh (looking the class up
        # statically twice cost about a tenth of a call_one).
        ref = self._endpoint_refs.get(name)
        if ref is not None:
            return ref
        attr = inspect.getattr_static(self._cls, name, None)
        if isinstance(attr, EndpointDescriptor):
            ref = EndpointRef(self, name, bool(getattr(attr, "answers_through_port", False)))
            self._endpoint_refs[name] = ref
            return ref
        if inspect.isfunction(attr):
            return NotAnEndpoint(self, name)
        raise AttributeError(f"{self._cls.__qualname__} has no endpoint {name!r} (mark it with @endpoint)")

    def slice(self, **selectors: Union[int, slice, range]) -> "ActorMesh[A]":
        """A sub-mesh, with Python's indexing rules: ``gpus=1`` (or ``-1``,
        the last) selects one index and drops the dimension,
        ``gpus=slice(0, -1)`` keeps the indices ``range(size)[0:-1]``. Errors
        as :meth:`Shape.select`."""
        resolved = self._shape.resolve(selectors)
        shape = self._shape.apply(resolved)
        sub = ActorMesh(self._cls, self._name, self._refs, shape, self._proc_mesh,
                        self._route.select(self._shape, resolved, shape))
        sub._token, sub._base_position = self._token, self._base_position
        sub._in_flight = self._in_flight
        sub._whole = False
        return sub

    def stop(self, reason: str = "") -> "Future[None]":
        """Stops every actor of this (sliced) mesh once it has handled what it
        was sent; each runs its ``__cleanup__(None)``. The future (``await``
        or ``.get()``) completes once every one of them has stopped. Later
        calls to them fail naming ``reason`` (Monarch's ``stop(reason=...)``)."""
        refs = self._ordered_refs()
        done = _castmesh.watch_stopped(refs)
        if self._token is not None:
            supervision.stopping(self._token, [self._base_position[rank] for rank in self._shape.ranks], reason)
        self._route.stop(self)

        def wait(timeout: Optional[float]) -> None:
            _wait_slot(done, timeout, "confirmation that it stopped", "stop", repr(self))

        return Future(wait, done.add_callback)

    def __reduce__(self) -> Any:
        addresses = {rank: self._refs[rank].address for rank in self._shape.ranks}
        return (_rebuild_actor_mesh, (self._cls, self._name, addresses, self._shape, self._whole))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name} of {self._cls.__qualname__} {self._shape}>"


def _supervised(mesh: "ActorMesh[A]", refs: List["_castmesh.ActorRef"], owner: Optional[str] = None) -> "ActorMesh[A]":
    """Registers a mesh this process just spawned with castmesh.supervision:
    its owner is `owner`, else the actor running this code (None: the
    controller's code)."""
    if owner is None:
        ctx = _context.current()
        owner = None if ctx is None else ctx.address
    mesh._base_position = {rank: position for position, rank in enumerate(mesh.shape.ranks)}
    # In the shape's row-major order (refs come in the C++ mesh's ascending one).
    mesh._token = supervision.watch(mesh.name, mesh.shape, mesh._ordered_refs(), owner)
    # Now that failures are watched, the constructors may run.
    for ref in refs:
        ref.tell(supervision.INIT_ENDPOINT, b"")
    return mesh


def _rebuild_actor_mesh(cls: type, name: str, addresses: Mapping[int, str], shape: Shape,
                        whole: bool = True) -> ActorMesh[Any]:
    refs = {rank: _castmesh.ActorRef.from_address(addr) for rank, addr in addresses.items()}
    mesh: ActorMesh[Any] = ActorMesh(cls, name, refs, shape)
    mesh._whole = whole
    return mesh
