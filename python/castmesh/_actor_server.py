"""Worker side of a Python actor: ``castmesh.PyActorServer`` (C++, one
dedicated thread per actor) creates one ActorServer and hands it every call.

A call's reply is built by castmesh._replies (``("ok", value)`` or the
error that the call raised, marked when it failed the actor); an endpoint
that raises an ``Exception`` does not stop its actor. The actor *fails*
(``failure`` is set; the C++ server then fails, so its mesh and owner see it)
when its constructor raises, when an endpoint raises a ``BaseException``
that is not an ``Exception``, or when its ``__supervise__`` does not handle
a failure of a mesh it owns. ``__cleanup__(exc)`` runs when it stops, for
any reason (``exc``: the exception it failed with, or None).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from typing import Any, Callable, Dict, Optional, Set, Tuple

from . import _castmesh, _context, _serial
from ._replies import error_reply, reply_piece, user_traceback
from .actor import AS_ENDPOINT, AS_ENDPOINT_WITH_PORT, REDUCE_PREFIX, EndpointDescriptor
from .errors import ActorError, ActorFailedError, SupervisionError
from .ports import PORT_KWARG, DroppingPort, Port
from .shape import Point, shape_from_plain
from .supervision import INIT_ENDPOINT, SUPERVISE_ENDPOINT


class _AnsweringPort(Port[Any]):
    """The response port a concurrent explicit-response call gets: it
    remembers whether the call answered (pickles as a plain Port)."""

    __slots__ = ("answered",)

    def __init__(self, port: Port[Any]) -> None:
        super().__init__(port.address, port._rank)
        self.answered = False

    def send(self, value: Any) -> None:
        self.answered = True
        super().send(value)

    def exception(self, error: BaseException) -> None:
        self.answered = True
        super().exception(error)


_NO_RESULT = object()
# How many slices' points an actor remembers (_message_point) before starting afresh.
_MESSAGE_POINTS_KEPT = 64
class ActorServer:
    """Holds one Python actor instance and dispatches calls to its endpoints."""

    def __init__(self, spec: bytes, address: str, index: int) -> None:
        self._address = address
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # An actor with a concurrent endpoint runs its event loop on a thread
        # of its own (forever, so that calls keep running between messages)
        # and all its Python code there; this thread then waits for it.
        self._loop_thread: Optional[threading.Thread] = None
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._stopping = False
        # The value of the call being answered, for reply_piece.
        self._result: Any = _NO_RESULT
        self._instance: Any = None
        self._init_error: Optional[bytes] = None
        self._context: Optional[_context.ActorContext] = None
        self._endpoints: dict = {}
        # The actor's point in each slice calls were sent to, by that slice (_message_point).
        self._message_points: Dict[Tuple[Any, ...], Point] = {}
        # Why this actor failed ("Type: message"), read by the C++ server after
        # its constructor and each call; None while it is healthy.
        self.failure: Optional[str] = None
        self._failure_exception: Optional[BaseException] = None
        # The class and its arguments until the constructor runs: at the
        # first message, normally the INIT_ENDPOINT tell the spawner sends
        # once it watches this actor, so that a failing constructor is seen
        # by its supervisor with its reason.
        self._pending: Optional[Tuple[Any, tuple, dict]] = None
        # The actor's class, as its handler slices in a trace name it ("Worker.ping"); read by the C++ server.
        self.trace_class = ""
        try:
            cls, args, kwargs, name, shape, base_rank_to_position, extra = _serial.loads(spec)
            self.trace_class = str(getattr(cls, "__qualname__", cls))
            # A one-point mesh (this_proc().spawn) has its point whatever index
            # the runtime gave the actor.
            position = 0 if len(shape) == 1 else base_rank_to_position.get(index, index)
            point = shape.point(position)
            self._context = _context.ActorContext(
                Point(point.rank, point.coords, point.base_rank), shape.sizes, name, address, index,
                f"{cls.__module__}.{cls.__qualname__}", extra.get("controller", ""), extra.get("proc_mesh"))
            self._pending = (cls, args, kwargs)
        except BaseException as error:  # noqa: BLE001 - reported to every caller
            self._init_error = error_reply(error)
            self._fail(error, "its spawn message did not load:")

    def _construct(self) -> None:
        if self._pending is None:
            return
        cls, args, kwargs = self._pending
        self._pending = None
        _context.set_current(self._context)
        if _has_concurrent_endpoint(cls):
            self._start_loop_thread()
        try:
            self._instance = self._invoke(cls, *args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - reported to every caller
            self._init_error = error_reply(error)
            self._fail(error, f"its constructor {getattr(cls, '__qualname__', cls)}() raised")
            # The reason's later lines (MeshFailure.reason): the user's frames.
            self.failure += "\n" + user_traceback(error).rstrip()

    def handle(self, endpoint: str, payload: memoryview, oneway: bool = False) -> bytes:
        """Runs one endpoint call; never raises (errors become the reply).

        ``oneway`` calls (broadcast) have no caller to raise to: their errors
        are printed to the worker's stderr, naming the actor. A call named
        ``castmesh.reduce:<op>:<endpoint>`` (an Accumulator's) is answered
        with a piece for the C++ reducer (see :func:`reply_piece`)."""
        if not endpoint.startswith(REDUCE_PREFIX):
            return self._handle(endpoint, payload, oneway)
        _op, _, name = endpoint[len(REDUCE_PREFIX):].partition(":")
        self._result = _NO_RESULT
        reply = self._handle(name, payload, oneway)
        result, self._result = self._result, _NO_RESULT
        return reply_piece(result, reply)

    def _handle(self, endpoint: str, payload: memoryview, oneway: bool) -> bytes:
        self._construct()
        if endpoint == INIT_ENDPOINT and self._init_error is None:
            return _serial.dumps(("ok", None))
        if self._init_error is not None:
            # The constructor's own message: the failure it caused reports it
            # to the owner (MeshFailure), once per mesh rather than per proc.
            if oneway and endpoint != INIT_ENDPOINT:
                self._report(endpoint, self._init_error)
            return self._init_error
        # Set per call: the server may be created on another thread than the
        # one that runs its calls.
        _context.set_current(self._context)
        if self.failure is not None:
            return self._init_error or error_reply(RuntimeError(f"actor {self._address} has failed: {self.failure}"))
        if endpoint == SUPERVISE_ENDPOINT:
            return self._supervise(payload)
        port = None
        sent_to = None
        try:
            args, kwargs = _serial.loads(payload)
            slice_shape = kwargs.pop(_context.MESSAGE_SHAPE_KWARG, None)
            sent_to = _context.set_message_point(self._message_point(slice_shape))
            descriptor = self._endpoint(endpoint)
            port = self._response_port(kwargs, descriptor.answers_through_port)
            if descriptor.concurrent:
                self._start_concurrent(descriptor, port, args, kwargs)
                return _serial.dumps(("ok", None))
            if descriptor.explicit_response_port:
                # It answers through `port`, now or later; nothing to reply.
                self._invoke(descriptor.fn, self._instance, port, *args, **kwargs)
                return _serial.dumps(("ok", None))
            result = self._invoke(descriptor.fn, self._instance, *args, **kwargs)
            if port is not None:
                port.send(result)
            self._result = result
            return _serial.dumps(("ok", result))
        except Exception as error:  # noqa: BLE001 - every failure goes back to the caller
            reply = error_reply(error)
            if port is not None:
                port.exception(error)
            elif oneway:
                self._report(endpoint, reply)
            return reply
        except BaseException as error:  # noqa: BLE001 - the actor fails; the caller still hears why
            reply = error_reply(error, fails_actor=True)
            if oneway:  # a caller gets it in the reply; the owner in a MeshFailure
                self._report(endpoint, reply)
            self._fail(error, f"{endpoint}() raised")
            return reply
        finally:
            if sent_to is not None:
                _context.reset_message_point(sent_to)

    def _message_point(self, plain: Optional[Tuple[Any, ...]]) -> Optional[Point]:
        """This actor's point in the slice a call was sent to (`plain`: its
        shape, shape_to_plain), None for the whole mesh (where it is the
        actor's own point). Remembered per slice: a mesh's callers use few."""
        ctx = self._context
        if plain is None or ctx is None:
            return None
        point = self._message_points.get(plain)
        if point is None:
            shape = shape_from_plain(plain)
            try:
                point = shape.point(shape.ranks.index(ctx.point.base_rank))
            except ValueError:  # not a member of that slice (cannot happen through castmesh's meshes)
                return None
            if len(self._message_points) >= _MESSAGE_POINTS_KEPT:
                self._message_points.clear()
            self._message_points[plain] = point
        return point

    def _response_port(self, kwargs: dict, explicit: bool) -> Any:
        """The port the caller wants the answer at (send(..., port=...), or
        an explicit-response endpoint's caller), stamped with this member's
        rank; an explicit-response endpoint with no caller waiting gets a
        port that drops what it is sent."""
        address = kwargs.pop(PORT_KWARG, None)
        if address is None:
            return DroppingPort() if explicit else None
        ctx = self._context
        return Port(address, None if ctx is None else ctx.point.base_rank)

    def _invoke(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, awaited if it gives an awaitable: on this
        thread (its loop runs only meanwhile), or, for an actor with a loop
        thread, there (this thread waits), so that it interleaves with that
        actor's concurrent calls only at ``await``. Raises what fn raises."""
        if self._loop_thread is None:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                return self._event_loop().run_until_complete(result)
            return result

        async def body() -> Tuple[bool, Any]:
            # BaseExceptions are carried back, not raised in the loop (a
            # SystemExit escaping a task would end the loop's thread).
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                return True, result
            except BaseException as error:  # noqa: BLE001 - re-raised on the calling thread
                return False, error

        assert self._loop is not None
        ok, value = asyncio.run_coroutine_threadsafe(body(), self._loop).result()
        if ok:
            return value
        raise value

    def _start_loop_thread(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        started = threading.Event()
        ctx = self._context

        def run() -> None:
            asyncio.set_event_loop(loop)
            _context.set_current(ctx)
            loop.call_soon(started.set)
            loop.run_forever()

        self._loop_thread = threading.Thread(target=run, name=f"castmesh-actor-loop-{self._address}", daemon=True)
        self._loop_thread.start()
        started.wait()

    def _start_concurrent(self, descriptor: Any, port: Any, args: tuple, kwargs: dict) -> None:
        """Starts one call of a concurrent endpoint as a task on the actor's
        loop; tasks are created in the order calls arrive, so they start in
        that order."""
        assert self._loop is not None

        def create() -> None:
            task = self._loop.create_task(self._run_concurrent(descriptor, port, args, kwargs))  # type: ignore
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._loop.call_soon_threadsafe(create)

    async def _run_concurrent(self, descriptor: Any, port: Any, args: tuple, kwargs: dict) -> None:
        explicit = descriptor.explicit_response_port
        if explicit and not isinstance(port, DroppingPort):
            port = _AnsweringPort(port)
        try:
            if explicit:
                await descriptor.fn(self._instance, port, *args, **kwargs)
            else:
                port.send(await descriptor.fn(self._instance, *args, **kwargs))
        except asyncio.CancelledError as error:
            why = "the actor stopped while it ran" if self._stopping else "it was cancelled"
            self._tell_caller(port, self._actor_error(error, f"{descriptor.name}() did not finish: {why}"))
            if self._stopping:
                return  # cancelled because the actor stops: not a failure
            raise
        except Exception as error:  # noqa: BLE001 - the caller's error, or the actor's failure
            if explicit:
                self._tell_caller(port, self._actor_error(error))
                self._fail_later(error, f"{descriptor.name}() raised without answering through its port:")
            elif isinstance(port, DroppingPort):
                self._report(descriptor.name, error_reply(error))
            else:
                port.exception(self._actor_error(error))
        except BaseException as error:  # noqa: BLE001 - the actor fails; the caller still hears why
            self._tell_caller(port, self._actor_error(error, fails_actor=True))
            self._fail_later(error, f"{descriptor.name}() raised")

    @staticmethod
    def _tell_caller(port: Any, error: ActorError) -> None:
        """Sends `error` to a caller still waiting for an answer (not to the
        caller of an explicit-response call that was answered already)."""
        if not getattr(port, "answered", False):
            port.exception(error)

    def _actor_error(self, error: BaseException, message: Optional[str] = None,
                     fails_actor: bool = False) -> ActorError:
        """What the caller of a concurrent call raises for `error` (as for
        any endpoint: an ActorError naming the remote type and this actor;
        an ActorFailedError when it failed the actor)."""
        kind = type(error)
        text = user_traceback(error)
        return (ActorFailedError if fails_actor else ActorError)(f"{kind.__module__}.{kind.__qualname__}", str(error) if message is None else message,
                          text, self._address)

    def _fail_later(self, error: BaseException, what: str) -> None:
        """Fails the actor from a concurrent call: records why, then sends the
        actor a no-op message, after which the C++ server sees the failure."""
        print(f"castmesh: actor {self._address}: {what} {type(error).__qualname__}: {error}",
              file=sys.stderr, flush=True)
        self._fail(error, what)
        _castmesh.ActorRef.from_address(self._address).tell(INIT_ENDPOINT, b"")

    def _fail(self, error: BaseException, what: str) -> None:
        self._failure_exception = error
        self.failure = f"{what} {type(error).__qualname__}: {error}"

    def _supervise(self, payload: memoryview) -> bytes:
        """A mesh this actor spawned lost a member: ``__supervise__(failure)``
        decides; not handled (falsy, raised, or no hook) fails this actor, so
        the failure goes on to this actor's own owner."""
        failure = _serial.loads(payload)
        hook = getattr(self._instance, "__supervise__", None)
        try:
            handled = bool(self._invoke(hook, failure)) if hook is not None else False
        except BaseException as error:  # noqa: BLE001 - a failing hook leaves it unhandled
            print(f"castmesh: actor {self._address}: __supervise__ raised {type(error).__qualname__}: {error}",
                  file=sys.stderr, flush=True)
            handled = False
        if not handled:
            self._failure_exception = SupervisionError(failure.report())
            self.failure = f"unhandled failure of a mesh it owns: {failure.report()}"
        return _serial.dumps(("ok", handled))

    def _report(self, endpoint: str, reply: bytes) -> None:
        _, (type_name, message, text, _) = _serial.loads(reply)
        print(f"castmesh: actor {self._address}: broadcast {endpoint}() raised {type_name}: {message}\n{text}",
              file=sys.stderr, flush=True)

    def _endpoint(self, name: str) -> Any:
        fn = self._endpoints.get(name)
        if fn is None:
            for prefix, explicit in ((AS_ENDPOINT, False), (AS_ENDPOINT_WITH_PORT, True)):
                if name.startswith(prefix):
                    # A plain method called through castmesh.as_endpoint.
                    method = inspect.getattr_static(type(self._instance), name[len(prefix):], None)
                    if not inspect.isfunction(method):
                        raise AttributeError(f"{type(self._instance).__qualname__} has no method "
                                             f"{name[len(prefix):]!r}")
                    fn = self._endpoints[name] = EndpointDescriptor(method, explicit)
                    return fn
            attr = inspect.getattr_static(type(self._instance), name, None)
            if not isinstance(attr, EndpointDescriptor):
                raise AttributeError(f"{type(self._instance).__qualname__} has no endpoint {name!r}")
            fn = self._endpoints[name] = attr
        return fn

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        # One loop per actor, on the actor's own thread: async endpoints run to
        # completion one at a time, like sync ones.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def close(self) -> None:
        """The actor stopped: run its ``__cleanup__(exc)``, close its loop and
        flush output. A cleanup that raises is reported on stderr."""
        if self._loop_thread is not None:
            self._stopping = True
            try:
                self._invoke(self._cancel_tasks)
            except BaseException as error:  # noqa: BLE001 - the actor is stopping anyway
                print(f"castmesh: actor {self._address}: cancelling its concurrent calls raised "
                      f"{type(error).__qualname__}: {error}", file=sys.stderr, flush=True)
        cleanup = getattr(self._instance, "__cleanup__", None) if self._instance is not None else None
        if cleanup is not None:
            _context.set_current(self._context)
            try:
                self._invoke(cleanup, self._failure_exception)
            except BaseException as error:  # noqa: BLE001 - the actor is stopping anyway
                print(f"castmesh: actor {self._address}: __cleanup__ raised {type(error).__qualname__}: {error}",
                      file=sys.stderr, flush=True)
        if self._loop_thread is not None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join()
            self._loop_thread = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._instance = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass


    async def _cancel_tasks(self) -> None:
        """Cancels the concurrent calls still running and waits for them
        (including ones they started meanwhile)."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _has_concurrent_endpoint(cls: type) -> bool:
    return any(isinstance(attr, EndpointDescriptor) and attr.concurrent
               for klass in cls.__mro__ for attr in vars(klass).values())
