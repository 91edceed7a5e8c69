"""Where code runs (Monarch's ``context()``) and controller singletons.

``context().actor_instance`` describes the calling actor (its ``rank`` in the
mesh it was spawned with, ``name``, ``actor_id``, ``proc_id``, ``class_name``,
``proc_mesh`` and ``proc``); in the controller's own code it describes the
controller ("client", rank 0 of no dimensions). ``current_actor_name()`` is
the actor's id.

``get_or_spawn_controller(name, Class, *args)`` gives the one actor named
``name`` in the controller's process, spawning it on first use; any actor
(or the controller) asking for the same name gets the same actor. The
singletons are kept by a registry actor the controller starts with its
runtime, at a fixed address every worker can derive from the controller's.
"""

from __future__ import annotations

from typing import Any, Dict, NoReturn, Optional, Tuple, Type, TypeVar

from . import _castmesh, _context
from .actor import Actor, endpoint
from .future import Future
from .shape import Point, Shape

__all__ = ["ActorAborted", "Context", "Instance", "context", "current_actor_name", "get_or_spawn_controller"]

A = TypeVar("A", bound=Actor)

# Name and index of the registry actor in the controller's proc.
REGISTRY_NAME = "castmesh.controllers"
REGISTRY_INDEX = 0


class Instance:
    """The actor running the caller (or the controller, "client")."""

    __slots__ = ("rank", "name", "actor_id", "proc_id", "class_name", "proc_mesh")

    def __init__(self, rank: Point, name: str, actor_id: str, proc_id: str, class_name: Optional[str],
                 proc_mesh: Any) -> None:
        self.rank = rank  # its Point in the mesh it was spawned with
        self.name = name  # the name it was spawned with
        self.actor_id = actor_id  # its address
        self.proc_id = proc_id  # its proc's address
        self.class_name = class_name  # module.QualifiedName (None for the controller)
        self.proc_mesh = proc_mesh  # the ProcMesh it was spawned on (None: this_proc() / the controller)

    @property
    def proc(self) -> Any:
        """Its own proc, as a one-proc slice of :attr:`proc_mesh` (None when
        it was not spawned on a proc mesh)."""
        if self.proc_mesh is None:
            return None
        return self.proc_mesh.slice(**dict(self.rank))

    def stop(self) -> None:
        """Stops this actor once it has handled the message it is on
        (Monarch's ``context().actor_instance.stop()``); it runs ``__cleanup__(None)``."""
        self._check_actor("stop")
        _castmesh.ActorRef.from_address(self.actor_id).stop()

    def abort(self, reason: str = "aborted") -> NoReturn:
        """Fails this actor now, with `reason`: raises :class:`ActorAborted`
        (a BaseException, so an endpoint's ``except Exception`` lets it
        through); the caller of the running endpoint gets ActorFailedError and
        its owner a MeshFailure, as for any failure."""
        self._check_actor("abort")
        raise ActorAborted(reason)

    def _check_actor(self, what: str) -> None:
        if self.class_name is None:
            raise RuntimeError(f"{what}() is for the actor running the caller; this is the controller "
                               "('client'): stop its meshes instead")

    def __repr__(self) -> str:
        return f"<Instance {self.name} {self.actor_id}>"


class ActorAborted(BaseException):
    """Raised by :meth:`Instance.abort` in an actor: it fails the actor."""


class Context:
    """What ``context()`` returns."""

    __slots__ = ("actor_instance",)

    def __init__(self, actor_instance: Instance) -> None:
        self.actor_instance = actor_instance

    @property
    def message_rank(self) -> Point:
        """The actor's point. (Monarch gives the point within the slice the
        current message was sent to; castmesh messages do not carry it, so
        this is the actor's point in the mesh it was spawned with.)"""
        return self.actor_instance.rank


def context() -> Context:
    """The calling actor's context (inside an actor), or the controller's."""
    ctx = _context.current()
    if ctx is not None:
        # The last "/" ends the proc: actor names never hold one, proc
        # addresses may ("unix:/tmp/...", where there are no abstract sockets).
        proc_id = ctx.address.rsplit("/", 1)[0]
        return Context(Instance(ctx.point, ctx.name, ctx.address, proc_id, ctx.class_name, ctx.proc_mesh))
    from .mesh import _runtime

    address = "" if _context.in_worker() else _runtime().address
    return Context(Instance(Point(0, {}), "client", f"{address}/client", address, None, None))


def current_actor_name() -> str:
    """The calling actor's id (its address); ``<controller>/client`` in the
    controller's own code."""
    return context().actor_instance.actor_id


class _Controllers(Actor):
    """The registry of controller singletons, one per controller process."""

    def __init__(self) -> None:
        self._meshes: Dict[str, Any] = {}

    @endpoint
    def get_or_spawn(self, name: str, cls: Type[Actor], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        mesh = self._meshes.get(name)
        if mesh is None:
            from .mesh import this_proc

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
        """Starts procs for an actor elsewhere (this_host().spawn_procs in an
        actor); they are stopped when that actor stops."""
        from .mesh import this_host

        procs = this_host().spawn_procs(dims, join_timeout=join_timeout)
        stopped = _castmesh.watch_stopped([_castmesh.ActorRef.from_address(owner)])
        stopped.add_callback(procs.stop)
        return procs

    @endpoint
    def stop_procs(self, key: str) -> None:
        """Stops a proc mesh of this controller for an actor that holds it."""
        from .mesh import _proc_meshes_by_key

        procs = _proc_meshes_by_key.get(key)
        if procs is not None:
            procs.stop().get()

    def __supervise__(self, failure: Any) -> bool:
        # A controller singleton failed: the controller's code decides.
        from . import supervision

        supervision.deliver_to_controller(failure)
        return True


def registry_address(controller: str) -> str:
    return f"{controller}/{REGISTRY_NAME}[{REGISTRY_INDEX}]"


def start_registry(runtime: "_castmesh.Runtime") -> None:
    """Called once by the controller's runtime when it is made."""
    from .mesh import _spec

    shape = Shape({})
    spec = _spec(_Controllers, (), {}, REGISTRY_NAME, shape)
    ref = runtime.spawn_local(REGISTRY_NAME, spec, REGISTRY_INDEX)
    ref.tell(_init_endpoint(), b"")


def _init_endpoint() -> str:
    from .supervision import INIT_ENDPOINT

    return INIT_ENDPOINT


def registry() -> Any:
    """The registry actor (an ActorMesh of one), from the controller or any actor."""
    from .mesh import _controller_address, _rebuild_actor_mesh

    controller = _controller_address()
    if not controller:
        raise RuntimeError("this actor does not know its controller (it was not spawned by castmesh)")
    return _rebuild_actor_mesh(_Controllers, REGISTRY_NAME, {0: registry_address(controller)}, Shape({}))


def get_or_spawn_controller(name: str, cls: Type[A], *args: Any, **kwargs: Any) -> "Future[Any]":
    """The actor ``name`` of class ``cls`` in the controller's process
    (an ActorMesh of one), spawned with ``cls(*args, **kwargs)`` by the
    first caller; later callers, from any actor, get the same one."""
    return registry().get_or_spawn.call_one(name, cls, args, kwargs)
