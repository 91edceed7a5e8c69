"""Where the calling code runs: the controller or one actor of a mesh, and
the slice of it the message being handled was sent to.

Each Python actor runs on its own dedicated thread in its worker proc, so the
"current actor" is thread-local. The current message's point is a context
variable: concurrent calls of one actor (asyncio tasks) each see their own.
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any, Dict, Optional



class _Local(threading.local):
    # A class default: a thread that never set one reads None without the
    # AttributeError that getattr(local, "ctx", None) raises and swallows
    # (0.4 us, on every castmesh.MPI call through COMM_WORLD).
    ctx: Optional["ActorContext"] = None


_local = _Local()

# Where a call to a slice of a mesh carries that slice's shape (as
# shape.shape_to_plain gives it; a keyword no Python function can declare);
# calls to a whole mesh carry none.
MESSAGE_SHAPE_KWARG = "castmesh.message_shape"
# The actor's point within the slice the current message was sent to (None:
# the whole mesh, where it is the actor's own point).
_message_point: "contextvars.ContextVar[Any]" = contextvars.ContextVar("castmesh_message_point", default=None)


class ActorContext:
    """What an actor knows about its place in its mesh."""

    __slots__ = ("point", "sizes", "name", "address", "proc_rank", "class_name", "controller", "proc_mesh")

    def __init__(self, point: Any, sizes: Dict[str, int], name: str, address: str, proc_rank: int,
                 class_name: str = "", controller: str = "", proc_mesh: Any = None) -> None:
        self.point = point
        self.sizes = sizes
        self.name = name
        self.address = address
        self.proc_rank = proc_rank
        self.class_name = class_name  # module.QualifiedName of the actor's class
        self.controller = controller  # the controller's proc address ("" if unknown)
        self.proc_mesh = proc_mesh  # the ProcMesh it was spawned on (None: this_proc())


def set_current(ctx: Optional[ActorContext]) -> None:
    _local.ctx = ctx


def current() -> Optional[ActorContext]:
    return _local.ctx


def message_point() -> Any:
    """The current message's point in the slice it was sent to (None: the whole mesh)."""
    return _message_point.get()


def set_message_point(point: Any) -> "contextvars.Token[Any]":
    """Sets the current message's point until :func:`reset_message_point` (actor thread)."""
    return _message_point.set(point)


def reset_message_point(token: "contextvars.Token[Any]") -> None:
    _message_point.reset(token)


def in_worker() -> bool:
    """True in a worker proc started by castmesh (not the controller)."""
    return os.environ.get("CASTMESH_PY_WORKER") == "1"
