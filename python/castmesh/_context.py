"""Where the calling code runs: the controller or one actor of a mesh.

Each Python actor runs on its own dedicated thread in its worker proc, so the
"current actor" is thread-local.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional

_local = threading.local()


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
    return getattr(_local, "ctx", None)


def in_worker() -> bool:
    """True in a worker proc started by castmesh (not the controller)."""
    return os.environ.get("CASTMESH_PY_WORKER") == "1"
