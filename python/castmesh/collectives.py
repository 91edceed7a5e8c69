"""MPI-style collectives among actor-mesh members or SPMD processes.

Inside an endpoint of an actor of a mesh::

    comm = castmesh.collectives.current()        # ranks in row-major order of the mesh
    comm.allreduce(grads)                         # in place, op="sum"
    row = castmesh.collectives.mesh_comm(dims=["gpus"])   # peers differing only in "gpus"

In a program started by a launcher (``mpirun -n 4 python prog.py``,
``srun python prog.py``)::

    comm = castmesh.collectives.world()

Buffers are any object with ``__dlpack__`` or the buffer protocol (NumPy
arrays, ``castmesh.Tensor``, PyTorch CPU tensors, ``bytearray``); data is
never copied on the way in, and the GIL is released while it moves.
Methods follow torch.distributed, with MPI's names: reductions write into
``out`` when given, else into the input in place; ``async_op=True`` returns
a :class:`Request` (``.wait(timeout=None)``, ``.test()``, ``await request``)
instead of blocking. (mpi4py's own API, whose lower-case methods pickle
Python objects, is ``from castmesh import MPI``: docs/mpi4py.md.)

Timeouts: blocking collectives, ``recv`` and ``probe`` take ``timeout=``
(seconds); without it they use the communicator's default,
``comm.timeout`` (None, waiting for ever, until set; set on one rank it holds
for that rank's every handle on the group, ``current()`` included). On expiry
they raise :class:`CommunicatorTimeoutError` (a ``CommunicatorError`` and a
``TimeoutError``) naming the ranks that did not arrive (for a collective:
those that did not also time out within it; give every rank the same
timeout). A collective that timed out leaves the communicator broken: every
later call on it fails at once saying why (make a new one); a receive that
timed out leaves it usable. Point-to-point tag ``ROLL_CALL_TAG`` is reserved
for that roll call.

CUDA/ROCm tensors (any DLPack device array, or
``castmesh.tensor_engine.empty``) go to NCCL/RCCL through the tensor_engine
backend, enqueued on ``stream=`` (a ``castmesh.tensor_engine.Stream``;
default: the communicator's own); ``Request.wait_stream(s)`` orders stream
``s`` after such a request. See docs/collectives.md.
"""

from __future__ import annotations

import array
import asyncio
import os
import threading
import time
import warnings
from typing import Any, Callable, Dict, Generator, List, NamedTuple, Optional, Sequence

from . import _castmesh
from .errors import CommunicatorError, CommunicatorTimeoutError
from .tensor import Tensor, empty, from_dlpack

ANY_SOURCE: int = _castmesh.ANY_SOURCE
ANY_TAG: int = _castmesh.ANY_TAG
UNDEFINED: int = _castmesh.UNDEFINED
# The point-to-point tag of the roll call after a collective timed out (see above).
ROLL_CALL_TAG: int = 2**31 - 1

__all__ = ["ANY_SOURCE", "ANY_TAG", "UNDEFINED", "ROLL_CALL_TAG", "Communicator", "CommunicatorError",
           "CommunicatorTimeoutError", "Op", "Request", "Status", "current", "data_path_bytes", "mesh_comm", "world"]


class Status(NamedTuple):
    """What a receive or probe matched (MPI_Status)."""

    source: int
    tag: int
    bytes: int


class Op:
    """A user-defined reduction: ``fn(a, b)`` over NumPy arrays, ``a`` holding the lower ranks' data.

    ``fn`` returns the result or writes it into ``b``. With ``commutative=False``
    ranks are combined in rank order.
    """

    def __init__(self, fn: Callable[[Any, Any], Any], commutative: bool = True, name: Optional[str] = None) -> None:
        self.fn = fn
        self.commutative = commutative
        self.name = name or getattr(fn, "__name__", "user_op")


_DLPACK_CUDA = 2
_DLPACK_ROCM = 10


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else from_dlpack(x)


def _like(x: Any, leading: Optional[int] = None, divide: Optional[int] = None) -> Tensor:
    t = _tensor(x)
    shape = list(t.shape)
    if leading is not None:
        shape = [leading] + shape
    if divide is not None:
        numel = 1
        for s in shape:
            numel *= s
        if numel % divide:
            raise ValueError(f"{numel} elements do not split into {divide} equal blocks")
        shape = [numel // divide]
    kind, index = t.__dlpack_device__()
    if kind in (_DLPACK_CUDA, _DLPACK_ROCM):  # device input: the output on the same device
        from . import tensor_engine
        return tensor_engine.empty(shape, t.dtype, f"{'cuda' if kind == _DLPACK_CUDA else 'rocm'}:{index}")
    return empty(shape, t.dtype)


class Request:
    """A non-blocking operation in flight (``async_op=True``, ``isend``, ``irecv``).

    ``wait()`` blocks until it is done and returns None, or, for a receive, its
    :class:`Status`; ``await request`` does the same without blocking the event
    loop. Waiting past ``timeout`` raises :class:`CommunicatorTimeoutError` and
    leaves the operation pending (wait again, or give up on the communicator).
    """

    __slots__ = ("_impl", "_receive", "__weakref__")

    def __init__(self, impl: Any, receive: bool = False) -> None:
        self._impl = impl
        self._receive = receive

    def wait(self, timeout: Optional[float] = None) -> Optional[Status]:
        """Blocks until the operation completes; a receive returns its Status, others None.

        After ``timeout`` seconds (default: none) raises CommunicatorTimeoutError; the operation stays pending.
        """
        try:
            status = self._impl.wait(timeout)
        except CommunicatorTimeoutError:
            raise
        except TimeoutError:
            raise CommunicatorTimeoutError(
                f"the operation did not complete within {timeout:g}s (it is still pending)") from None
        return status if self._receive else None

    def test(self) -> bool:
        """True once complete (never blocks)."""
        return self._impl.test()

    def wait_stream(self, stream: Any) -> None:
        """Device work: ``stream``'s later work runs after this operation, without blocking the CPU."""
        self._impl.wait_stream(stream)

    def __await__(self) -> Generator[Any, None, Optional[Status]]:
        # The wait runs on the loop's executor: the GIL is released while it blocks.
        return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()

    @staticmethod
    def wait_all(requests: Sequence["Request"], timeout: Optional[float] = None) -> None:
        """Waits for every request; raises the first error (in list order)."""
        _castmesh.Request.wait_all([r._impl for r in requests], timeout)

    @staticmethod
    def wait_any(requests: Sequence["Request"], timeout: Optional[float] = None) -> int:
        """Waits until one request completes; returns its index."""
        return _castmesh.Request.wait_any([r._impl for r in requests], timeout)


class _GroupState:
    """What every handle of one group in this process shares (keyed by its id)."""

    __slots__ = ("timeout", "broken")

    def __init__(self) -> None:
        self.timeout: Optional[float] = None  # the default of blocking calls
        self.broken: Optional[str] = None     # why, once a collective timed out


_states: Dict[str, _GroupState] = {}
_states_lock = threading.Lock()
_ROLL_CALL_MAGIC = 0x636D_726F_6C6C  # "cmroll": a roll-call message, not a user's
_ROLL_CALL_GRACE_MAX = 10.0          # seconds the roll call listens at most
_WORLD_HINT_AFTER_S = 5.0            # world() without a rendezvous says how to set one after this


def _state_of(impl: Any) -> _GroupState:
    key = impl.id
    state = _states.get(key)
    if state is None:
        with _states_lock:
            state = _states.setdefault(key, _GroupState())
    return state


def _check_timeout(timeout: Optional[float]) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")


def _elements(x: Any) -> Optional[int]:
    try:
        return _tensor(x).size
    except Exception:  # noqa: BLE001 - not an array: the original error stands
        return None


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


class Communicator:
    """A group of ranks and this rank's place in it (wraps the C++ ``castmesh::Communicator``)."""

    def __init__(self, impl: Any, timeout: Optional[float] = None) -> None:
        self._impl = impl
        self._state = _state_of(impl)
        if timeout is not None:
            self.timeout = timeout

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def size(self) -> int:
        return self._impl.size

    @property
    def dims(self) -> dict:
        """The named dimensions of the ranks, e.g. ``{"hosts": 2, "gpus": 4}``."""
        return self._impl.dims

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a blocking collective, ``recv`` or ``probe`` waits when called without ``timeout=``
        (None: for ever). Shared by this process's handles on the group, inherited by ``along``/``split``/``dup``."""
        return self._state.timeout

    @timeout.setter
    def timeout(self, seconds: Optional[float]) -> None:
        _check_timeout(seconds)
        self._state.timeout = None if seconds is None else float(seconds)

    @property
    def broken(self) -> Optional[str]:
        """Why this communicator is unusable (a collective timed out), or None."""
        return self._state.broken

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, dims={self.dims})"

    # mpi4py spellings
    def Get_rank(self) -> int:  # noqa: N802
        """mpi4py's spelling of ``rank``."""
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        """mpi4py's spelling of ``size``."""
        return self.size

    # ---- failure handling ----
    def _check_usable(self) -> None:
        if self._state.broken is not None:
            raise CommunicatorError(self._state.broken, "FAILED_PRECONDITION")

    def _where(self) -> str:
        return f"on rank {self.rank} of communicator {self._impl.id}"

    def _break_by_notice(self, source: int) -> None:
        self._state.broken = (f"communicator {self._impl.id} is broken: a collective of rank {source} timed out "
                              f"while this rank (rank {self.rank}) had not called it")
        raise CommunicatorError(self._state.broken, "FAILED_PRECONDITION")

    def _check_notices(self) -> None:
        """A peer's roll call waiting here: it timed out in a collective this rank had not called."""
        found = self._impl.iprobe(ANY_SOURCE, ROLL_CALL_TAG)
        if found is not None:
            self._break_by_notice(found.source)

    def _roll_call(self, grace: float) -> List[int]:
        """After a collective timed out here: tells every peer so and listens up to
        `grace` seconds for theirs (the ranks inside the collective time out too).
        Returns the ranks not heard from."""
        impl, me, size = self._impl, self.rank, self.size
        note = array.array("q", [_ROLL_CALL_MAGIC, me])
        sends = []
        for dest in range(size):
            if dest != me:
                try:
                    sends.append(impl.isend(note, dest, ROLL_CALL_TAG))
                except Exception:  # noqa: BLE001 - a dead peer: it is not heard from either
                    pass
        heard = set()
        got = array.array("q", [0, 0])
        deadline = time.monotonic() + grace
        # Polled per source: an any-source receive fails at once when one peer is dead.
        while len(heard) < size - 1 and time.monotonic() < deadline:
            progressed = False
            for source in range(size):
                if source == me or source in heard:
                    continue
                if impl.iprobe(source, ROLL_CALL_TAG) is not None:
                    try:
                        impl.recv(got, source, ROLL_CALL_TAG, 1.0)
                        heard.add(source)
                        progressed = True
                    except Exception:  # noqa: BLE001 - gone meanwhile
                        pass
            if not progressed:
                time.sleep(0.002)
        del sends
        return [r for r in range(size) if r != me and r not in heard]

    def _timed_out(self, what: str, timeout: float) -> CommunicatorTimeoutError:
        self._state.broken = (f"communicator {self._impl.id} is broken: {what} timed out {self._where()} "
                              f"after {timeout:g}s; make a new communicator")
        missing = self._roll_call(min(max(timeout, 0.1), _ROLL_CALL_GRACE_MAX))
        if missing:
            why = f"{_ranks_text(missing)} did not arrive within {timeout:g}s"
        else:
            why = (f"every rank arrived, but it did not complete within {timeout:g}s "
                   "(a rank hung or died inside it)")
        self._state.broken = (f"communicator {self._impl.id} is broken: {what} timed out {self._where()} ({why}); "
                              "make a new communicator")
        return CommunicatorTimeoutError(
            f"{what} timed out {self._where()}: {why}; the communicator is now broken (every later call on it "
            "fails)", "DEADLINE_EXCEEDED", missing)

    def _run(self, what: str, timeout: Optional[float], async_op: bool,
             start: Callable[[bool], Any]) -> Optional[Request]:
        """A collective: `start(async_op)` starts it in the extension. Blocking with a
        timeout, it runs as a request waited for that long."""
        self._check_usable()
        if async_op:
            return Request(start(True))
        _check_timeout(timeout)
        limit = self._state.timeout if timeout is None else timeout
        if limit is None:
            start(False)
            return None
        self._check_notices()
        request = start(True)
        try:
            request.wait(limit)
        except TimeoutError:
            raise self._timed_out(what, limit) from None
        return None

    def _out_error(self, error: ValueError, what: str, out: Any, expected: Optional[int], needs: str) -> None:
        """Raises a ValueError naming ``out`` when `out` has not `expected` elements."""
        if out is None or expected is None:
            return
        n = _elements(out)
        if n is not None and n != expected:
            raise ValueError(f"{what}: out= has {n} elements, but {what} needs {expected} ({needs})") from error

    # ---- groups ----
    def _child(self, impl: Any) -> "Communicator":
        child = Communicator(impl)
        if child._state.timeout is None:
            child._state.timeout = self._state.timeout
        return child

    def along(self, dims: Sequence[str]) -> "Communicator":
        """The ranks that differ from this one only in ``dims``."""
        self._check_usable()
        return self._child(self._impl.along(list(dims)))

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """MPI_Comm_split; ``UNDEFINED`` gives None. Collective."""
        self._check_usable()
        sub = self._impl.split(color, key)
        return None if sub is None else self._child(sub)

    def dup(self) -> "Communicator":
        """MPI_Comm_dup: the same ranks in a new communicator whose messages never match this one's. Collective."""
        self._check_usable()
        return self._child(self._impl.dup())

    # ---- point to point ----
    def _check_tag(self, tag: int) -> None:
        if tag == ROLL_CALL_TAG:
            raise ValueError(f"tag {tag} is reserved (castmesh.collectives.ROLL_CALL_TAG)")

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Sends ``buf`` to rank ``dest`` with ``tag``; returns once ``buf`` may be reused."""
        self._check_usable()
        self._check_tag(tag)
        self._impl.send(buf, dest, tag)

    def isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Starts a send and returns its Request at once; ``buf`` must stay untouched until it completes."""
        self._check_usable()
        self._check_tag(tag)
        return Request(self._impl.isend(buf, dest, tag))

    def _received(self, status: Any) -> Status:
        if status.tag == ROLL_CALL_TAG:  # an any-tag receive took a peer's roll call
            self._break_by_notice(status.source)
        return status

    def _recv_timed_out(self, what: str, source: int, limit: float) -> CommunicatorTimeoutError:
        missing = [] if source == ANY_SOURCE else [source]
        sender = "any rank" if source == ANY_SOURCE else f"rank {source}"
        return CommunicatorTimeoutError(
            f"{what} {self._where()}: nothing from {sender} within {limit:g}s (the communicator stays usable)",
            "DEADLINE_EXCEEDED", missing)

    def recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             timeout: Optional[float] = None) -> Status:
        """Receives into ``buf``; ``timeout`` (default ``self.timeout``): CommunicatorTimeoutError after it."""
        self._check_usable()
        _check_timeout(timeout)
        limit = self._state.timeout if timeout is None else timeout
        try:
            status = self._impl.recv(buf, source, tag, limit)
        except TimeoutError:
            raise self._recv_timed_out(f"recv(source={source}, tag={tag})", source, limit) from None
        return self._received(status)

    def irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Starts a receive into ``buf`` and returns its Request; ``wait()`` gives the Status."""
        self._check_usable()
        return Request(self._impl.irecv(buf, source, tag), receive=True)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: Optional[float] = None) -> Status:
        """Waits for a matching message and describes it (not received); timeout as ``recv``."""
        self._check_usable()
        _check_timeout(timeout)
        limit = self._state.timeout if timeout is None else timeout
        try:
            return self._impl.probe(source, tag, limit)
        except TimeoutError:
            raise self._recv_timed_out(f"probe(source={source}, tag={tag})", source, limit) from None

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Optional[Status]:
        """The Status of a matching message that has arrived (not received), or None. Never blocks."""
        self._check_usable()
        return self._impl.iprobe(source, tag)

    # ---- collectives (timeout: seconds, default self.timeout; see the module's docstring) ----
    def barrier(self, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Request]:
        """Returns once every rank has entered it (``async_op``: a Request at once). Collective."""
        return self._run("barrier", timeout, async_op, self._impl.barrier)

    def _done(self, result: Any, out: Any) -> Any:
        return result if result is not None else out

    def allreduce(self, x: Any, op: Any = "sum", out: Any = None, async_op: bool = False,
                  stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Reduces ``x`` over every rank into ``out`` (default: ``x``, in place); returns the output."""
        if out is None:
            out = x
        state = self._state
        try:
            # The call a training loop makes most: nothing in its way when no timeout applies.
            if timeout is None and state.timeout is None and state.broken is None and not async_op:
                self._impl.allreduce(x, out, op, False, stream)
                return out
            request = self._run("allreduce", timeout, async_op,
                                lambda a: self._impl.allreduce(x, out, op, a, stream))
        except ValueError as error:
            if out is not x:
                self._out_error(error, "allreduce", out, _elements(x), "as many as x")
            raise
        return out if request is None else request

    def reduce(self, x: Any, root: int = 0, op: Any = "sum", out: Any = None, async_op: bool = False,
               stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Like allreduce; only ``root``'s output is written (default: ``x`` there)."""
        if out is None and self.rank == root:
            out = x
        try:
            result = self._run("reduce", timeout, async_op,
                               lambda a: self._impl.reduce(x, out, op, root, a, stream))
        except ValueError as error:
            if out is not x:
                self._out_error(error, "reduce", out, _elements(x), "as many as x")
            raise
        return self._done(result, out)

    def broadcast(self, x: Any, root: int = 0, async_op: bool = False,
                  stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Copies root's ``x`` into every rank's ``x``; returns ``x``."""
        return self._done(self._run("broadcast", timeout, async_op,
                                    lambda a: self._impl.broadcast(x, root, a, stream)), x)

    bcast = broadcast

    def allgather(self, x: Any, out: Any = None, async_op: bool = False,
                  stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Every rank's ``x``, stacked by rank (a new ``castmesh.Tensor`` of shape ``(size, *x.shape)`` unless ``out``)."""
        given = out
        out = _like(x, leading=self.size) if out is None else out
        try:
            result = self._run("allgather", timeout, async_op, lambda a: self._impl.allgather(x, out, a, stream))
        except ValueError as error:
            n = _elements(x)
            self._out_error(error, "allgather", given, None if n is None else n * self.size, "size × x's elements")
            raise
        return self._done(result, out)

    def gather(self, x: Any, root: int = 0, out: Any = None, async_op: bool = False,
               stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Like allgather, at ``root`` only (others get None)."""
        given = out
        if out is None and self.rank == root:
            out = _like(x, leading=self.size)
        try:
            result = self._run("gather", timeout, async_op, lambda a: self._impl.gather(x, out, root, a, stream))
        except ValueError as error:
            n = _elements(x)
            self._out_error(error, "gather", given, None if n is None else n * self.size, "size × x's elements")
            raise
        return self._done(result, out)

    def scatter(self, x: Any, out: Any, root: int = 0, async_op: bool = False,
                stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Block r of root's ``x`` (``size`` blocks the size of ``out``) goes to rank r's ``out``."""
        send = x if self.rank == root else None
        try:
            result = self._run("scatter", timeout, async_op, lambda a: self._impl.scatter(send, out, root, a, stream))
        except ValueError as error:
            n = None if send is None else _elements(send)
            if n is not None and n % self.size == 0:
                self._out_error(error, "scatter", out, n // self.size, f"x's {n} elements in {self.size} blocks")
            raise
        return self._done(result, out)

    def reduce_scatter(self, x: Any, op: Any = "sum", out: Any = None, async_op: bool = False,
                       stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Block ``rank`` of the reduction of every rank's ``x`` (``size`` equal blocks, flattened)."""
        given = out
        out = _like(x, divide=self.size) if out is None else out
        try:
            result = self._run("reduce_scatter", timeout, async_op,
                               lambda a: self._impl.reduce_scatter(x, out, op, a, stream))
        except ValueError as error:
            n = _elements(x)
            if n is not None and n % self.size == 0:
                self._out_error(error, "reduce_scatter", given, n // self.size,
                                f"x's {n} elements in {self.size} blocks")
            raise
        return self._done(result, out)

    def alltoall(self, x: Any, out: Any = None, async_op: bool = False,
                 stream: Any = None, timeout: Optional[float] = None) -> Any:
        """Block j of this rank's ``x`` goes to block ``rank`` of rank j's output."""
        given = out
        out = _like(x) if out is None else out
        try:
            result = self._run("alltoall", timeout, async_op, lambda a: self._impl.alltoall(x, out, a, stream))
        except ValueError as error:
            self._out_error(error, "alltoall", given, _elements(x), "as many as x")
            raise
        return self._done(result, out)


def data_path_bytes() -> Dict[str, int]:
    """Body bytes this process's collectives moved by each data path since it
    started: ``shared_memory`` (same-host rings), ``single_copy`` (read from a
    same-host sender's memory) and ``socket`` (the proc connection). Peers on
    different hosts only ever use ``socket`` (docs/hosts.md)."""
    return dict(_castmesh.data_path_bytes())


def current(timeout: Optional[float] = None) -> Communicator:
    """The communicator of the actor mesh whose endpoint is running (ranks in row-major order).

    ``timeout``: sets its default (``Communicator.timeout``) for this rank."""
    return Communicator(_castmesh.current_communicator(), timeout)


def mesh_comm(dims: Optional[Sequence[str]] = None) -> Communicator:
    """``current()``, or the peers that differ from this rank only in ``dims``."""
    comm = current()
    return comm if dims is None else comm.along(dims)


def world(rendezvous: str = "", secret: str = "", timeout: float = 60.0) -> Communicator:
    """The communicator of every process of an SPMD job (``mpirun``/``srun``/indexed Job).

    Rank and size come from the launcher's variables; rank 0 listens on
    ``rendezvous`` (default ``CASTMESH_RENDEZVOUS``, else a single-host address
    derived from the job id) and the others join it. Without a rendezvous, a
    world not met after 5 s warns (RuntimeWarning) what to set: ranks started
    by hand, not by one launcher, do not meet at the derived address.
    """
    if rendezvous or os.environ.get("CASTMESH_RENDEZVOUS"):
        return Communicator(_castmesh.world_communicator(rendezvous, secret, timeout))
    # The default address comes from the launcher's job id (or the parent's
    # pid): ranks started by hand never meet there. Say so while waiting.
    result: List[Any] = []

    def join() -> None:
        try:
            result.append(_castmesh.world_communicator(rendezvous, secret, timeout))
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            result.append(error)

    joiner = threading.Thread(target=join, name="castmesh-world-join", daemon=True)
    joiner.start()
    joiner.join(min(_WORLD_HINT_AFTER_S, timeout))
    if joiner.is_alive():
        warnings.warn(
            f"castmesh.collectives.world() has not met its peers after {_WORLD_HINT_AFTER_S:g} s (it gives up "
            f"after {timeout:g} s): without CASTMESH_RENDEZVOUS the ranks meet at an address derived from their "
            "launcher's job id, or from their parent process id where there is none, so ranks started by hand "
            "(not by one mpirun/srun) never meet. Set CASTMESH_RENDEZVOUS=tcp:HOST:PORT (rank 0's host) and "
            "CASTMESH_SECRET in every rank, or pass rendezvous= and secret=", RuntimeWarning, stacklevel=2)
        joiner.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return Communicator(result[0])
