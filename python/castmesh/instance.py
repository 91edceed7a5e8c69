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
runtime (castmesh.proc_mesh), at a fixed address every worker can derive
from the controller's.
"""

from __future__ import annotations

from typing import Any, NoReturn, Optional, Type, TypeVar

from . import _castmesh, _context, _runtime
from .actor import Actor
from .future import Future
from .proc_mesh import registry
from .shape import Point

__all__ = ["ActorAborted", "Context", "Instance", "context", "current_actor_name", "get_or_spawn_controller"]

A = TypeVar("A", bound=Actor)


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
        """Where this actor appears in the slice the current message was sent
        to, as Monarch defines it (not the actor's identity): a call to the
        whole mesh gives the actor's rank; to ``mesh.slice(gpus=slice(2, 4))``
        the member at gpus 2 has ``{"gpus": 0}``; a call to one member
        (``call_one`` on a one-point slice, ``choose``) a point of no
        dimensions. Outside a message (the constructor) and in the
        controller: :attr:`Instance.rank`."""
        point = _context.message_point()
        return self.actor_instance.rank if point is None else point


def context() -> Context:
    """The calling actor's context (inside an actor), or the controller's."""
    ctx = _context.current()
    if ctx is not None:
        # The last "/" ends the proc: actor names never hold one, proc
        # addresses may ("unix:/tmp/...", where there are no abstract sockets).
        proc_id = ctx.address.rsplit("/", 1)[0]
        return Context(Instance(ctx.point, ctx.name, ctx.address, proc_id, ctx.class_name, ctx.proc_mesh))
    address = "" if _context.in_worker() else _runtime.runtime().address
    return Context(Instance(Point(0, {}), "client", f"{address}/client", address, None, None))


def current_actor_name() -> str:
    """The calling actor's id (its address); ``<controller>/client`` in the
    controller's own code."""
    return context().actor_instance.actor_id


def get_or_spawn_controller(name: str, cls: Type[A], *args: Any, **kwargs: Any) -> "Future[Any]":
    """The actor ``name`` of class ``cls`` in the controller's process
    (an ActorMesh of one), spawned with ``cls(*args, **kwargs)`` by the
    first caller; later callers, from any actor, get the same one."""
    return registry().get_or_spawn.call_one(name, cls, args, kwargs)
