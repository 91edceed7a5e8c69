"""Meshes of procs: :class:`ProcMesh` (started by ``HostMesh.spawn_procs``
or joined through a :class:`Rendezvous`), :func:`this_proc`, and the
controller's registry actor, through which actors spawn on, start and stop
the controller's procs and share controller singletons.

``this_host().spawn_procs(per_host={"gpus": 4})`` starts four worker procs
(``python -m castmesh._worker``) through castmesh's C++ LocalAllocator;
``procs.spawn("name", Cls, *args)`` puts one ``Cls`` on each
(castmesh.actor_mesh).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, TypeVar, Union, cast

import cloudpickle

from . import _castmesh, _context, _runtime, supervision
from .actor import Actor, endpoint
from .actor_mesh import ActorMesh, _rebuild_actor_mesh, _supervised, _TreeRoute
from .errors import ProcError, with_context
from .future import Future, gather, in_thread
from .shape import MeshShapeOps, Shape, ValueMesh

__all__ = ["ProcMesh", "Rendezvous", "rendezvous_proc_mesh", "this_proc"]

A = TypeVar("A", bound=Actor)

# Name and index of the registry actor in the controller's proc.
REGISTRY_NAME = "castmesh.controllers"
REGISTRY_INDEX = 0


def _spec(cls: type, args: tuple, kwargs: dict, name: str, shape: Shape, proc_ranks: Optional[List[int]] = None,
          proc_mesh: Optional["ProcMesh"] = None) -> bytes:
    """What a PyActorServer is created from. `proc_ranks`: the base ranks of
    the procs in the order of `shape`'s points (default: `shape`'s ranks);
    each server finds its point from the rank in its address. `proc_mesh`:
    what context().actor_instance.proc_mesh gives inside the actors."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn needs a subclass of castmesh.Actor, got {cls!r}")
    positions = {rank: position for position, rank in enumerate(shape.ranks if proc_ranks is None else proc_ranks)}
    extra = {"controller": _runtime.controller_address(), "proc_mesh": proc_mesh}
    return cloudpickle.dumps((cls, args, kwargs, name, shape, positions, extra))



class ProcMesh(MeshShapeOps):
    """Worker procs with a shape, started by :meth:`HostMesh.spawn_procs` (or
    by a launcher, joined through a :class:`Rendezvous`).

    Use as a context manager or call :meth:`stop` (also done at exit).
    """

    def __init__(self, impl: Optional["_castmesh.ProcMesh"], shape: Shape, root: Optional["ProcMesh"] = None,
                 ops: Tuple[Any, ...] = (), remote: Optional[Tuple[str, str]] = None) -> None:
        # impl: the C++ ProcMesh view of exactly these procs (None for a mesh
        # unpickled in another process: `remote` is then its controller's
        # address and the root's key there); root: the mesh as allocated
        # (None: this is it), which owns the procs' lifetime; ops: the slices
        # and reshapes that lead from the root to this view.
        self._impl = impl
        self._shape = shape
        self._root = root
        self._ops = ops
        self._remote = remote
        self._stopped = False
        self._meshes: List[Optional[int]] = []  # supervision tokens of the actor meshes spawned on it
        # How many meshes of each name were spawned on these procs (the root's):
        # a name spawned again gets actors of their own ("name~2", ...), as in Monarch.
        self._spawned_names: Dict[str, int] = {}
        self._spawned_names_lock = threading.Lock()
        self._stop_future: Optional[Future[None]] = None
        if root is None and remote is None:
            self._key = f"{os.getpid()}-{id(self)}"
            _runtime.proc_meshes_by_key[self._key] = self
            _runtime.live_proc_meshes.add(self)

    @property
    def shape(self) -> Shape:
        """The procs' shape (named dimensions; a slice keeps the base ranks)."""
        return self._shape

    def __len__(self) -> int:
        return len(self._shape)

    @property
    def proc_ids(self) -> List[str]:
        """The procs' addresses (``tcp:HOST:PORT``, ``unix:...``), in row-major order
        (in the controller that started them)."""
        return self._row_major(lambda impl: impl.ids, "addresses")

    @property
    def pids(self) -> List[int]:
        """Operating-system process ids of the procs, in row-major order
        (in the controller that started them)."""
        return self._row_major(lambda impl: impl.pids, "pids")

    def _row_major(self, of_procs: Callable[[Any], List[Any]], what: str) -> List[Any]:
        """A per-proc value of the C++ mesh (ascending rank order) in this view's row-major order."""
        if self._impl is None:
            raise ProcError(f"the {what} of a proc mesh are known in its controller only", "FAILED_PRECONDITION")
        by_rank = dict(zip(self._shape.ascending_ranks, of_procs(self._impl)))
        return [by_rank[rank] for rank in self._shape.ranks]

    def slice(self, **selectors: Union[int, slice, range]) -> "ProcMesh":
        """Some of the procs, with Python's indexing rules (as
        :meth:`ActorMesh.slice`); spawning on a slice puts actors on those
        procs only. Stopping is done on the whole mesh. A mesh reshaped by
        flatten/rename/split cannot be sliced (slice first, then reshape)."""
        if any(op[0] == "shape" for op in self._ops):
            raise ValueError(f"cannot slice the reshaped proc mesh {self._shape}: slice it before flatten, "
                             f"rename or split")
        return self._select(self._shape.resolve(selectors))

    def _select(self, resolved: List[Any]) -> "ProcMesh":
        """The slice of `resolved` selectors (Shape.resolve of this mesh's shape)."""
        impl = self._impl
        if impl is not None:
            for name, sel, _ in resolved:
                impl = impl.select_index(name, sel) if isinstance(sel, int) else impl.select_range(name, *sel)
        return ProcMesh(impl, self._shape.apply(resolved), self._root or self,
                        self._ops + (("select", tuple(resolved)),), self._remote)

    def _with_shape(self, shape: Shape) -> "ProcMesh":
        """The same procs (same order) under another shape; actors spawned on
        it get that shape."""
        return ProcMesh(self._impl, shape, self._root or self, self._ops + (("shape", shape),), self._remote)

    def __reduce__(self) -> Any:
        # Into an actor: a handle that spawns through the controller.
        root = self._root or self
        remote = root._remote or (_runtime.controller_address(), root._key)
        return (_rebuild_proc_mesh, (remote, self._ops, self._shape))

    def _is_stopped(self) -> bool:
        return (self._root or self)._stopped

    def spawn(self, name: str, cls: Type[A], *args: Any, **kwargs: Any) -> A:
        """Creates one ``cls(*args, **kwargs)`` per proc, named ``name``.

        Returns once every actor is registered; the constructors run next
        (one that raises fails its member, see Supervision). The actor mesh
        has this mesh's sizes (on a slice, its members numbered 0..n-1). In an
        actor (a proc mesh passed to it), the controller spawns on its behalf
        and the calling actor supervises the new mesh.

        The result is an :class:`ActorMesh`; type checkers see ``cls`` (as
        Monarch types it), whose endpoints are then typed adverbs
        (``mesh.ping.call_one(1)``: ``Future[int]``)."""
        if self._impl is None:
            ctx = _context.current()
            owner = None if ctx is None else ctx.address
            return registry().spawn_on.call_one(self, name, cls, args, kwargs, owner).get()
        return cast(A, self._spawn(name, cls, args, kwargs, None))

    def _spawn(self, name: str, cls: Type[A], args: tuple, kwargs: dict, owner: Optional[str]) -> ActorMesh[A]:
        """spawn() in the controller; `owner`: the supervising actor (None:
        the actor or code running this)."""
        if self._is_stopped():
            raise ProcError("spawn on a stopped proc mesh", "FAILED_PRECONDITION")
        # Numbered 0..n-1 in the order of the C++ proc mesh (ascending), as
        # its actor mesh is; reversed where this slice is.
        shape = Shape._of(Shape(self._shape.sizes)._impl, self._shape._flips)
        spec = _spec(cls, args, kwargs, name, shape, self._shape.ranks, self)
        root = self._root or self
        with root._spawned_names_lock:
            spawned = root._spawned_names.get(name, 0)
            root._spawned_names[name] = spawned + 1
        try:
            cmesh = self._impl.spawn_mesh(name if spawned == 0 else f"{name}~{spawned + 1}", spec,
                                          list(shape.sizes.items()))
        except ProcError as error:
            raise with_context(error, f"spawning {name!r} failed") from None
        refs = cmesh.refs()
        mesh = _supervised(ActorMesh(cls, name, dict(enumerate(refs)), shape, self, _TreeRoute(cmesh, shape.labels)),
                           refs, owner)
        (self._root or self)._meshes.append(mesh._token)
        return mesh

    def stop(self, reason: str = "") -> "Future[None]":
        """Asks every proc to exit; the future (``await`` or ``.get()``)
        completes once they have (stragglers busy in an endpoint for 5 s are
        killed with a warning; procs started by a launcher cannot be, and are
        warned about). Actors on them are stopped, not failed. Idempotent: a
        second call gives the same future. Only the whole mesh can be
        stopped, not a slice of it (ValueError). Later calls to its actors
        fail naming ``reason`` (Monarch's ``stop(reason=...)``)."""
        if self._root is not None:
            raise ValueError(f"stop() the whole proc mesh, not the slice {self._shape} of it")
        if self._stop_future is not None:
            return self._stop_future
        if self._remote is not None:
            # Unpickled in an actor: the controller stops it.
            done = registry().stop_procs.call_one(self._remote[1])
            self._stop_future = gather([done], lambda values: None)
            return self._stop_future
        self._stopped = True
        for token in self._meshes:
            supervision.stopping(token, None, reason or "its proc mesh was stopped")
        impl = self._impl

        def stop_procs() -> None:
            try:
                impl.stop()
            except ProcError as error:
                # Procs busy in an endpoint past the grace period were killed:
                # the mesh is stopped all the same.
                warnings.warn(f"castmesh: {error.code}: {error}", RuntimeWarning, stacklevel=2)
            finally:
                # Until here, exit waits for this stop (_shutdown).
                _runtime.live_proc_meshes.discard(self)

        self._stop_future = in_thread(stop_procs, f"castmesh-stop-{self._shape}")
        return self._stop_future

    def logging_option(self, stream_to_client: bool = False, aggregate_window_sec: Optional[float] = None,
                       level: int = logging.INFO) -> "Future[None]":
        """Where the procs' output goes (Monarch's signature; a Future,
        awaitable and ``.get()``-able). Everything the procs write to their
        stdout and stderr (file descriptors 1 and 2: Python, C and C++ alike)
        and their Python ``logging`` (root level set to ``level``, to stderr)
        is captured; with ``stream_to_client`` it arrives here, stdout to
        stdout and stderr to stderr, each line prefixed with the proc's point
        and host, in each proc's order; otherwise it goes where it went
        before (the agent's or launcher's terminal). With
        ``aggregate_window_sec``, identical lines of several procs within the
        window are printed once with a count. Lossless while a proc's unsent
        lines stay under 8 MiB; beyond that its oldest lines are dropped (a
        notice says how many), never blocking its actors. On by default for
        procs on other hosts (``attach_to_workers``)."""
        if self._impl is None:
            raise ProcError("logging_option is set in the controller that started the procs", "FAILED_PRECONDITION")
        impl = self._impl
        window = float(aggregate_window_sec or 0.0)

        def apply() -> None:
            self._run_in_every_proc(functools.partial(_set_logging_level, level), "logging_option")
            _castmesh.forward_output(impl, stream_to_client, window, 0)

        return in_thread(apply, f"castmesh-logging-{self._shape}")

    def _run_in_every_proc(self, fn: Callable[[], Any], what: str) -> "ValueMesh[Any]":
        """Runs ``fn()`` once in every proc of this mesh (a short-lived actor
        per proc, whose rank is the proc's row-major position) and returns
        the results; raises ProcError naming ``what`` with the first error."""
        runners = self._spawn(f"castmesh_{what}", _RunInProc, (), {}, None)
        try:
            return runners.run.call(fn).get()
        except Exception as error:
            raise ProcError(f"{what} raised in a proc: {error}", "FAILED_PRECONDITION") from error
        finally:
            runners.stop().get()

    def __enter__(self) -> "ProcMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop().get()

    async def __aenter__(self) -> "ProcMesh":
        await self.initialized
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    @property
    def initialized(self) -> "Future[None]":
        """Resolves (``await`` or ``.get()``) once the procs are up, as
        Monarch's: castmesh's ``spawn_procs`` returns with them up, so it
        is resolved already (fails for a stopped mesh)."""
        if self._is_stopped():
            error = ProcError(f"the proc mesh {self._shape} has been stopped", "FAILED_PRECONDITION")

            def fail(timeout: Optional[float]) -> None:
                raise error

            return Future(fail, lambda cb: cb())
        return Future.ready(None)

    def __repr__(self) -> str:
        state = "stopped" if self._is_stopped() else "running"
        return f"<ProcMesh {self._shape} {state}>"


class _RunInProc(Actor):
    """Runs a function in its proc (ProcMesh._run_in_every_proc)."""

    @endpoint
    def run(self, fn: Callable[[], Any]) -> Any:
        return fn()


def _set_logging_level(level: int) -> None:
    """A proc's Python logging: the root at ``level``, writing to stderr."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    root.setLevel(level)


class _LocalProc:
    """The proc running the caller, as returned by :func:`this_proc`."""

    def spawn(self, name: str, cls: Type[A], *args: Any, **kwargs: Any) -> A:
        """Spawns one actor in this proc (its own thread); an ActorMesh, typed as ProcMesh.spawn's."""
        shape = Shape({})
        spec = _spec(cls, args, kwargs, name, shape)
        if _context.in_worker():
            ref = _castmesh.spawn_in_this_proc(name, spec)
        else:
            ref = _runtime.runtime().spawn_local(name, spec)
        return cast(A, _supervised(ActorMesh(cls, name, {0: ref}, shape), [ref]))

    @property
    def rank(self) -> int:
        """Rank of this proc in its proc mesh (0 for the controller)."""
        ctx = _context.current()
        return 0 if ctx is None else ctx.proc_rank

    def __repr__(self) -> str:
        return f"<this proc (pid {os.getpid()})>"


def _local_spawn_procs(per_host: Optional[Mapping[str, int]], join_timeout: float) -> ProcMesh:
    """this_host().spawn_procs: worker procs on this machine, shaped by
    ``per_host``'s names (e.g. ``{"gpus": 4}``). Inside an actor, the
    controller starts them on its behalf: the actor can spawn on them and
    stop them, supervises the actor meshes it spawns there, and the procs are
    stopped when the actor stops."""
    if _context.in_worker():
        ctx = _context.current()
        if ctx is None:
            raise RuntimeError("only actors can start procs in a worker proc")
        return registry().spawn_procs.call_one(_mesh_dims(per_host), join_timeout, ctx.address).get()
    shape = Shape(_mesh_dims(per_host))
    env = [("CASTMESH_PY_PATH", os.pathsep.join(p for p in sys.path if p))]
    argv = [sys.executable, "-m", "castmesh._worker"]
    try:
        impl = _runtime.runtime().allocate(list(shape.sizes.items()), argv, env, join_timeout)
    except ProcError as error:
        raise with_context(error, f"starting {len(shape)} worker procs failed") from None
    return ProcMesh(impl, shape)


def _mesh_dims(dims: Optional[Mapping[str, int]]) -> Dict[str, int]:
    dims = dict(dims or {"procs": 1})
    for label, size in dims.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh size {label!r} must be a positive int, got {size!r}")
    return dims


class Rendezvous:
    """Procs started by a launcher (``srun``, ``mpirun``, ``mpiexec``, a
    Kubernetes indexed Job) join this controller at an address.

    ``Rendezvous("tcp:0.0.0.0:29500", secret=...)`` makes this process's
    castmesh runtime listen there (port 0: a free port); :attr:`address` is
    what the workers get as ``CASTMESH_RENDEZVOUS`` (with ``CASTMESH_SECRET``
    and their rank from the launcher; docs/procs.md, "Running on a
    cluster"); :meth:`proc_mesh` waits for them. ``secret`` defaults to
    ``$CASTMESH_SECRET``; one of the two is required. A process has one
    controller address: make the Rendezvous before any other proc mesh
    (``this_host().spawn_procs`` then reuses that address); a second
    Rendezvous reuses the first one's address (and secret) when ``listen`` is
    that address or has port 0.
    """

    def __init__(self, listen: str, *, secret: Optional[str] = None, advertise_host: Optional[str] = None) -> None:
        self._runtime = _runtime.runtime(listen=listen, secret=secret or "", advertise_host=advertise_host or "")

    @property
    def address(self) -> str:
        """The address to give the workers (``CASTMESH_RENDEZVOUS``), e.g. ``tcp:node01:29500``."""
        return self._runtime.address

    def proc_mesh(self, dims: Optional[Mapping[str, int]] = None, *, join_timeout: float = 60.0) -> ProcMesh:
        """Waits for the product of ``dims``'s sizes procs to join and returns
        their mesh shaped by ``dims`` (e.g. ``{"hosts": 2, "gpus": 4}``); the
        proc of rank r (the rank its launcher gave it) sits at row-major
        position r. Raises :class:`ProcError` when a proc reports another
        mesh size, a bad or duplicate rank, or when some never join within
        ``join_timeout`` seconds (the message names them)."""
        shape = Shape(_mesh_dims(dims))
        try:
            impl = self._runtime.allocate_rendezvous(list(shape.sizes.items()), join_timeout)
        except ProcError as error:
            raise with_context(error, f"waiting for {len(shape)} procs at {self.address} failed") from None
        return ProcMesh(impl, shape)

    def __repr__(self) -> str:
        return f"<Rendezvous {self.address}>"


def rendezvous_proc_mesh(dims: Optional[Mapping[str, int]] = None, *, listen: str, secret: Optional[str] = None,
                         advertise_host: Optional[str] = None, join_timeout: float = 60.0) -> ProcMesh:
    """``Rendezvous(listen, secret=...).proc_mesh(dims)``: a mesh of procs
    started by a launcher, which join at ``listen`` (a fixed port, so the
    launcher's command line can name it before this runs)."""
    return Rendezvous(listen, secret=secret, advertise_host=advertise_host).proc_mesh(dims, join_timeout=join_timeout)


def _rebuild_proc_mesh(remote: Tuple[str, str], ops: Tuple[Any, ...], shape: Shape) -> ProcMesh:
    controller, key = remote
    here = not _context.in_worker() and controller == _runtime.controller_address()
    root = _runtime.proc_meshes_by_key.get(key) if here else None
    if root is None:
        return ProcMesh(None, shape, None, ops, remote)
    mesh = root
    for kind, what in ops:
        mesh = mesh._select(list(what)) if kind == "select" else mesh._with_shape(what)
    return mesh


_this_proc = _LocalProc()


def this_proc() -> _LocalProc:
    """The proc running the caller (the controller, or an actor's worker)."""
    return _this_proc


class _Controllers(Actor):
    """The registry of the controller (one per controller process, started
    with its runtime): controller singletons (castmesh.instance), and the
    controller's procs for actors elsewhere."""

    def __init__(self) -> None:
        self._meshes: Dict[str, Any] = {}

    @endpoint
    def get_or_spawn(self, name: str, cls: Type[Actor], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        mesh = self._meshes.get(name)
        if mesh is None:
            mesh = self._meshes[name] = this_proc().spawn(name, cls, *args, **kwargs)
        elif mesh._cls is not cls and mesh._cls.__qualname__ != cls.__qualname__:
            raise TypeError(f"controller {name!r} is a {mesh._cls.__qualname__}, not a {cls.__qualname__}")
        return mesh

    @endpoint
    def spawn_on(self, proc_mesh: Any, name: str, cls: Type[Actor], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any], owner: Optional[str]) -> Any:
        """Spawns on a proc mesh of this controller for an actor elsewhere
        (a ProcMesh pickled into it), which supervises the new mesh."""
        return proc_mesh._spawn(name, cls, args, kwargs, owner)

    @endpoint
    def spawn_procs(self, dims: Dict[str, int], join_timeout: float, owner: str) -> Any:
        """Starts procs on this host for an actor elsewhere (this_host().spawn_procs
        in an actor); they are stopped when that actor stops."""
        procs = _local_spawn_procs(dims, join_timeout)
        stopped = _castmesh.watch_stopped([_castmesh.ActorRef.from_address(owner)])
        stopped.add_callback(procs.stop)
        return procs

    @endpoint
    def stop_procs(self, key: str) -> None:
        """Stops a proc mesh of this controller for an actor that holds it."""
        procs = _runtime.proc_meshes_by_key.get(key)
        if procs is not None:
            procs.stop().get()

    def __supervise__(self, failure: Any) -> bool:
        # A controller singleton failed: the controller's code decides.
        supervision.deliver_to_controller(failure)
        return True


def registry_address(controller: str) -> str:
    """The address of the controller-singleton registry actor of the controller at ``controller``."""
    return f"{controller}/{REGISTRY_NAME}[{REGISTRY_INDEX}]"


def _start_registry(runtime: "_castmesh.Runtime") -> None:
    """Run once by the controller's runtime when it is made."""
    shape = Shape({})
    spec = _spec(_Controllers, (), {}, REGISTRY_NAME, shape)
    ref = runtime.spawn_local(REGISTRY_NAME, spec, REGISTRY_INDEX)
    ref.tell(supervision.INIT_ENDPOINT, b"")


_runtime.on_made(_start_registry)


def registry() -> Any:
    """The registry actor (an ActorMesh of one), from the controller or any actor."""
    controller = _runtime.controller_address()
    if not controller:
        raise RuntimeError("this actor does not know its controller (it was not spawned by castmesh)")
    return _rebuild_actor_mesh(_Controllers, REGISTRY_NAME, {0: registry_address(controller)}, Shape({}))
