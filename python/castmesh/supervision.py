"""Supervision of Python actors (Monarch's model).

An actor fails when its constructor raises, when an endpoint raises a
``BaseException`` that is not an ``Exception`` (e.g. ``SystemExit``,
``KeyboardInterrupt``), when it leaves a failure of a mesh it owns unhandled,
or when its proc dies. Each failed member of a mesh is reported once, as a
:class:`MeshFailure`, to the mesh's *owner*: the actor that spawned it (its
``__supervise__(failure)`` hook runs inside it, between its calls; a truthy
return value means handled, anything else fails the owner too, which then
reports to its own owner), or, for meshes spawned by the controller's own
code, :func:`castmesh.unhandled_fault_hook`. The default hook logs the
failure and ends the controller with exit status 1; assign another function
to ``castmesh.unhandled_fault_hook`` to decide otherwise (return normally:
handled; raise, ``SystemExit`` included: unhandled, the process exits 1).

Failures are seen through the runtime's monitors of the members (across
procs too); one Python thread per process (``castmesh-supervision``) turns
them into MeshFailures and delivers them. Members stopped on purpose
(``mesh.stop()``, ``procs.stop()``, exit) are not failures. At exit that
thread is ended and joined before Python finalizes (:func:`shutting_down`).
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
from datetime import datetime
from typing import Any, Dict, List, Optional

from . import _castmesh, _context, _serial

__all__ = ["MeshFailure", "unhandled_fault_hook"]

# The endpoint name a PyActorServer gets a MeshFailure under (not a Python
# identifier, so no user endpoint can clash with it).
SUPERVISE_ENDPOINT = "castmesh.__supervise__"
# The first message of every spawned actor: it runs the constructor (sent
# once the spawner watches the actor, as Monarch's Init message).
INIT_ENDPOINT = "castmesh.__init__"


class MeshFailure:
    """A member of a mesh failed: which mesh, which point, which actor, why.

    Attributes:
        mesh_name: the name the mesh was spawned with.
        point: the failed member's :class:`~castmesh.Point` in the mesh.
        points: every failed point this report is about (``[point]``).
        actor: the failed actor's address.
        reason: the runtime's status, e.g. ``"ABORTED: ... raised SystemExit: 3"``
            or ``"UNAVAILABLE: proc ... is gone"``.
    """

    def __init__(self, mesh_name: str, point: Any, actor: str, reason: str) -> None:
        self.mesh_name = mesh_name
        self.point = point
        self.points = [point]
        self.actor = actor
        self.reason = reason

    def report(self) -> str:
        """One line naming the mesh, point, actor and reason."""
        coords = ", ".join(f"{k}={v}" for k, v in dict(self.point).items())
        return f"mesh {self.mesh_name!r} member {{{coords}}} ({self.actor}) failed: {self.reason}"

    def __str__(self) -> str:
        # As Monarch's: the type and the member's rank first (code matching on them ports unchanged).
        rank = getattr(self.point, "rank", None)
        return f"MeshFailure(rank={rank}): {self.report()}" if rank is not None else f"MeshFailure: {self.report()}"

    def __repr__(self) -> str:
        return f"MeshFailure({self.report()!r})"


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default fate of a failure nobody handled: log it on stderr and end
    the controller with exit status 1 (``sys.exit(1)``; the exit itself is
    made by the supervision thread). Replace ``castmesh.unhandled_fault_hook``
    to handle failures yourself: returning normally drops the failure."""
    sys.stderr.write(f"castmesh: unhandled mesh failure in the controller (pid {os.getpid()}) at "
                     f"{datetime.now()}: {failure.report()}\n")
    sys.stderr.flush()
    sys.exit(1)


class _Watched:
    """What this process knows about a mesh it spawned and supervises."""

    __slots__ = ("name", "shape", "owner", "stopping", "failures", "stop_reason")

    def __init__(self, name: str, shape: Any, owner: Optional[str]) -> None:
        self.name = name
        self.shape = shape
        self.owner = owner  # address of the owning actor; None: the controller's code
        self.stopping: set = set()  # positions stopped on purpose
        self.failures: Dict[int, MeshFailure] = {}  # position -> its failure
        self.stop_reason = ""  # what stop(reason=...) said


_lock = threading.Lock()
_changed = threading.Condition(_lock)  # a failure was delivered (or dropped)
_records: Dict[int, _Watched] = {}
# Actors a call here saw fail whose failure the supervision thread has yet to
# deliver: exit waits for them (_EXPECTED_WAIT_S at most), so a script that
# ends right after such a call still meets its unhandled_fault_hook.
_expected: set = set()
_EXPECTED_WAIT_S = 10.0
_tokens = itertools.count(1)
_thread: Optional[threading.Thread] = None
_shutting_down = False
# How long exit waits for the supervision thread: it only outlives the wait
# while a user's hook (unhandled_fault_hook) is still running.
_JOIN_TIMEOUT_S = 10.0


def watch(name: str, shape: Any, refs: List[Any], owner: Optional[str]) -> int:
    """Supervises the members `refs` (in `shape`'s row-major order) of a mesh
    spawned by `owner` (an actor's address, or None for the controller's
    code); returns the token that :func:`stopping` takes."""
    global _thread
    with _lock:
        token = next(_tokens)
        _records[token] = _Watched(name, shape, owner)
        if _thread is None and not _shutting_down:
            _thread = threading.Thread(target=_deliver_forever, name="castmesh-supervision", daemon=True)
            _thread.start()
            # Also where castmesh._runtime's exit hook (which calls it too; the
            # second call does nothing) is not registered, e.g. in a worker.
            atexit.register(shutting_down)
    _castmesh.watch_failures(refs, token)
    return token


def stopping(token: Optional[int], positions: Optional[List[int]] = None, reason: str = "") -> None:
    """Members (all of them when `positions` is None) are being stopped on
    purpose: their end is not a failure; `reason` explains later calls' errors."""
    if token is None:
        return
    with _lock:
        record = _records.get(token)
        if record is not None:
            record.stopping.update(range(len(record.shape)) if positions is None else positions)
            if reason:
                record.stop_reason = reason


def stop_reason(token: Optional[int]) -> str:
    """What stop(reason=...) said of a watched mesh ("" if nothing)."""
    with _lock:
        record = _records.get(token) if token is not None else None
        return "" if record is None else record.stop_reason


def failures_of(token: Optional[int]) -> List[MeshFailure]:
    """The failures seen so far of the members of a watched mesh (in
    position order), to explain a call that failed."""
    if token is None:
        return []
    with _lock:
        record = _records.get(token)
        return [] if record is None else [record.failures[p] for p in sorted(record.failures)]


def wait_for_failures(token: Optional[int], timeout: float) -> List[MeshFailure]:
    """failures_of(token), waiting up to `timeout` s for a first one: a call
    learns that a member failed before the failure's report is delivered here."""
    if token is None:
        return []
    with _lock:
        record = _records.get(token)
        # A member stopped on purpose has no report coming.
        if record is not None and not (record.stopping - record.failures.keys()):
            _changed.wait_for(lambda: token not in _records or bool(_records[token].failures), timeout)
    return failures_of(token)


def summary(failures: List[MeshFailure]) -> str:
    """One account of several members' failures: the points that failed for
    each reason, then the first one's traceback (a reason's later lines)."""
    by_reason: Dict[str, List[str]] = {}
    details = ""
    for failure in failures:
        first, _, rest = failure.reason.partition("\n")
        coords = ", ".join(f"{k}={v}" for k, v in dict(failure.point).items())
        by_reason.setdefault(first, []).append(f"{{{coords}}}")
        if rest and not details:
            details = f"\n--- first failure ({{{coords}}}) ---\n{rest.rstrip()}"
    name = failures[0].mesh_name
    lines = [f"{len(points)} member{'s' if len(points) > 1 else ''} of mesh {name!r} failed ({', '.join(points)}): "
             f"{reason}" for reason, points in by_reason.items()]
    return "\n".join(lines) + details


def expect_failure(actor: str) -> None:
    """A call to `actor` here learnt that it failed: its MeshFailure is on its way."""
    if _context.in_worker():  # a worker's failures go to their owners, not its exit
        return
    with _lock:
        if not _shutting_down and _thread is not None:
            _expected.add(actor)


def _settled(actor: str) -> None:
    with _lock:
        _expected.discard(actor)
        _changed.notify_all()


def shutting_down() -> None:
    """The process is exiting: nothing that stops from now on is a failure.

    Ends the supervision thread and waits for it. Called at exit (atexit),
    while Python still runs threads: a daemon thread left waiting in
    ``next_failure`` would take the GIL back after finalization has begun,
    and Python ends such a thread with pthread_exit, whose unwinding through
    the binding's GIL guard (a noexcept destructor) aborts the process."""
    global _shutting_down
    with _lock:
        if _thread is not None and _thread is not threading.current_thread():
            _changed.wait_for(lambda: not _expected, _EXPECTED_WAIT_S)
        _shutting_down = True
        thread = _thread
    _castmesh.close_failures()  # next_failure() returns at once from now on
    if thread is None or thread is threading.current_thread():
        return
    thread.join(_JOIN_TIMEOUT_S)
    if thread.is_alive():
        sys.stderr.write(f"castmesh: the supervision thread is still running a fault hook after "
                         f"{_JOIN_TIMEOUT_S:g} s at exit\n")
        sys.stderr.flush()


def _deliver_forever() -> None:
    while not _shutting_down:
        item = _castmesh.next_failure(1.0)
        if item is None or _shutting_down:
            continue
        token, position, actor, reason = item
        with _lock:
            record = _records.get(token)
            if record is None or position in record.stopping:
                _expected.discard(actor)
                _changed.notify_all()
                continue
            record.stopping.add(position)  # reported once
            try:
                failure: Optional[MeshFailure] = MeshFailure(record.name, record.shape.point(position), actor, reason)
                record.failures[position] = failure
            except BaseException as error:  # noqa: BLE001 - the thread must survive
                failure = None
                sys.stderr.write(f"castmesh: could not report a mesh failure ({error!r})\n")
            _changed.notify_all()
        try:
            if failure is not None:
                _deliver(record.owner, failure)
        except BaseException as error:  # noqa: BLE001 - the thread must survive
            sys.stderr.write(f"castmesh: could not deliver a mesh failure ({error!r})\n")
        finally:
            _settled(actor)


def _deliver(owner: Optional[str], failure: MeshFailure) -> None:
    if owner is not None:
        # Into the owning actor, between its calls: its __supervise__ decides.
        _castmesh.ActorRef.from_address(owner).tell(SUPERVISE_ENDPOINT, _serial.dumps(failure))
        return
    if _context.in_worker():
        sys.stderr.write(f"castmesh: mesh failure with no owning actor in worker {os.getpid()}: "
                         f"{failure.report()}\n")
        return
    deliver_to_controller(failure)


def deliver_to_controller(failure: MeshFailure) -> None:
    """castmesh.unhandled_fault_hook(failure) in the controller; the process
    exits 1 if the hook raises."""
    # The package's attribute, which the user may have replaced (the package
    # is imported: it imports this module).
    hook = getattr(sys.modules.get("castmesh"), "unhandled_fault_hook", unhandled_fault_hook)
    try:
        hook(failure)
    except BaseException as error:  # noqa: BLE001 - SystemExit included: unhandled
        code = error.code if isinstance(error, SystemExit) and isinstance(error.code, int) and error.code else 1
        sys.stderr.write(f"castmesh: exiting with status {code}: unhandled mesh failure: {failure.report()}\n")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)
