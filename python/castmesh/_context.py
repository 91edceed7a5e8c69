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

    __slots__ = ("point", "sizes", "name", "address", "proc_rank")

    def __init__(self, point: Any, sizes: Dict[str, int], name: str, address: str, proc_rank: int) -> None:
        self.point = point
        self.sizes = sizes
        self.name = name
        self.address = address
        self.proc_rank = proc_rank


def set_current(ctx: Optional[ActorContext]) -> None:
    _local.ctx = ctx


def current() -> Optional[ActorContext]:
    return getattr(_local, "ctx", None)


def in_worker() -> bool:
    """True in a worker proc started by castmesh (not the controller)."""
    return os.environ.get("CASTMESH_PY_WORKER") == "1"
