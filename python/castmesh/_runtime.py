"""This process's controller runtime (one per process, made on first use)
and what lives as long as it: the proc meshes it still has to stop at exit.

Below every mesh module: meshes, ports and contexts reach the runtime here.
The registry of controller singletons, which the runtime starts as soon as it
exists, is defined above (castmesh.proc_mesh) and registers itself with
:func:`on_made`.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Callable, List, Optional, Tuple

from . import _castmesh, _context, supervision
from .errors import ProcError, with_context

_lock = threading.Lock()
_instance: Optional["_castmesh.Runtime"] = None
# Run with the runtime once it is made (outside the lock): the registry.
_on_made: List[Callable[["_castmesh.Runtime"], None]] = []
# Root proc meshes not stopped yet: exit stops them (and waits for that).
live_proc_meshes: "set[Any]" = set()
# Root proc meshes of this controller by key, for ProcMeshes pickled into
# actors and sent back (a ProcMesh unpickled here is the live one).
proc_meshes_by_key: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def on_made(fn: Callable[["_castmesh.Runtime"], None]) -> None:
    """Has ``fn(runtime)`` run once the runtime is made. Called at import by
    the module that defines the registry actor (castmesh.proc_mesh), which
    castmesh's package import always loads before any runtime is made."""
    _on_made.append(fn)


def current() -> Optional["_castmesh.Runtime"]:
    """The runtime if it is made already, else None (makes nothing)."""
    return _instance


def runtime(listen: Optional[str] = None, secret: str = "", advertise_host: str = "",
            tls: Tuple[str, ...] = ()) -> "_castmesh.Runtime":
    """This process's controller runtime, made on first use (listening at
    ``listen`` when given, for a Rendezvous; on a private Unix address
    otherwise)."""
    global _instance
    made = None
    with _lock:
        if _instance is None:
            if _context.in_worker():
                raise RuntimeError("worker procs cannot start procs of their own (yet); use this_proc()")
            try:
                _instance = _castmesh.Runtime(0, listen or "", secret, advertise_host, list(tls))
            except ProcError as error:
                raise with_context(error, f"cannot listen at {listen}") from None
            atexit.register(_shutdown)
            made = _instance
        elif listen is not None:
            current = _instance.address
            same = listen == current or (current.startswith("tcp:") and listen.startswith("tcp:")
                                         and listen.rsplit(":", 1)[-1] == "0")
            if not same:
                raise ProcError(
                    f"this controller already has the address {current} (a process has one); make the "
                    f"Rendezvous before any other proc mesh, or listen at {current}", "FAILED_PRECONDITION")
            wanted = secret or os.environ.get("CASTMESH_SECRET", "")
            if wanted and not _instance.has_secret(wanted):
                raise ProcError(f"this controller at {current} already has another mesh secret (a process has one)",
                                "FAILED_PRECONDITION")
        instance = _instance
    if made is not None:
        # The registry of controller singletons (get_or_spawn_controller),
        # at an address any actor can derive from the controller's.
        for fn in _on_made:
            fn(made)
    return instance


def controller_address() -> str:
    """The controller's proc address, from the controller or any actor."""
    ctx = _context.current()
    if ctx is not None and ctx.controller:
        return ctx.controller
    if _context.in_worker():
        return ""
    return runtime().address


def _shutdown() -> None:
    """At exit: stop every proc mesh still running, then the runtime."""
    global _instance
    supervision.shutting_down()
    for mesh in list(live_proc_meshes):
        try:
            mesh.stop().get()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    _castmesh.flush_forwarded_output()  # what the procs wrote before they stopped
    with _lock:
        instance, _instance = _instance, None
    if instance is not None:
        instance.shutdown()
