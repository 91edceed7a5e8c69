"""Stack dumps of running procs (docs/observability.md, "Stack dumps").

``castmesh.debug.stacks(mesh, timeout=2.0)`` asks every proc of a proc mesh
(or the procs an actor mesh was spawned on) for every thread's native stack,
its Python stack and the actor and message it is running now. Nothing in a
dump needs the GIL or the cooperation of a stuck thread: the native stacks
come from a per-thread signal, the Python ones from :mod:`faulthandler`
(registered for a castmesh signal in every Python proc), so a thread stuck in
C code shows its frames whether it holds the GIL or released it. A thread
that cannot answer within ``timeout`` is reported as such; a proc that does
not answer gets an ``error``. ``str()`` of the result is the text form.
"""

from __future__ import annotations

import _thread
import contextlib
import faulthandler
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Union

from . import _castmesh

if TYPE_CHECKING:
    from .mesh import ActorMesh, ProcMesh

__all__ = ["NativeFrame", "PythonFrame", "ThreadStack", "ProcStacks", "Stacks", "stack_signal", "stacks",
           "stacks_on_timeout", "this_process"]


@dataclass(frozen=True)
class NativeFrame:
    """One native frame: address, demangled function, object file, and the
    source line when ``addr2line`` (binutils) is on the proc's PATH."""
    pc: int
    function: str
    object: str
    offset: int
    file: str
    line: int


@dataclass(frozen=True)
class PythonFrame:
    """One Python frame (as :mod:`faulthandler` reports it)."""
    file: str
    line: int
    function: str


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a proc. ``python`` is None for a thread that runs no
    Python; ``actor``/``message_type`` are empty unless an actor's turn runs
    on the thread now; ``answered`` is False for a thread that did not
    answer within the timeout (then ``native`` is empty)."""
    tid: int
    name: str
    answered: bool
    native: List[NativeFrame]
    python: Optional[List[PythonFrame]]
    python_truncated: bool
    actor: str
    actor_class: str
    message_type: str


@dataclass(frozen=True)
class ProcStacks:
    """One proc's dump; ``error`` says why there is none (threads then empty)."""
    rank: int
    proc_id: str
    pid: int
    hostname: str
    error: Optional[str]
    python_error: str
    threads: List[ThreadStack]
    text: str

    def __str__(self) -> str:
        return self.text


class Stacks(List[ProcStacks]):
    """The dumps of a mesh's procs, in the mesh's order; ``str()`` is the text form."""

    def __str__(self) -> str:
        return "\n".join(p.text for p in self)

    def summary(self, frames: int = 6) -> str:
        """A few lines per proc: the threads that run an actor now (else
        those with Python frames), each with its innermost ``frames`` Python
        and native frames."""
        lines = []
        for p in self:
            head = f"rank {p.rank} pid {p.pid}"
            if p.error is not None:
                lines.append(f"{head}: no dump: {p.error}")
                continue
            shown = [t for t in p.threads if t.actor] or [t for t in p.threads if t.python]
            if not shown:
                lines.append(f"{head}: no actor runs and no thread runs Python")
            for t in shown:
                what = f"actor {t.actor} handling {t.message_type or '(between messages)'}" if t.actor else "no actor"
                lines.append(f"{head}: thread {t.tid} {t.name!r}: {what}")
                if not t.answered:
                    lines.append("    did not answer within the bound")
                if t.python:
                    lines.append("    python: " + " <- ".join(f"{f.function} at {f.file}:{f.line}"
                                                          for f in t.python[:frames]))
                if t.native:
                    lines.append("    native: " + " <- ".join(f.function or hex(f.pc) for f in t.native[:frames]))
        return "\n".join(lines)


_hook_lock = threading.Lock()
_hook_installed = False


def _install_python_hook() -> None:
    """Registers faulthandler for castmesh's dump signal in this process (at
    import: every Python proc, however it was started, shows its Python
    stacks). Idempotent."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        try:
            signum, fd = _castmesh.debug_python_stack_hook()
        except Exception:  # no memory file (not Linux): dumps leave Python out
            _hook_installed = True
            return
        _count_starting_threads()
        faulthandler.register(signum, file=fd, all_threads=True, chain=False)
        _castmesh.debug_python_stack_hook_ready()
        _hook_installed = True


def _count_starting_threads() -> None:
    """Tells the dump which Python threads are starting: CPython 3.11 links a
    new thread's state before the thread initialises it, and faulthandler's
    all-threads dump crashes on such a state, so no Python dump is taken
    while one is starting (castmesh/debug.h, python_thread_starting)."""
    original = _thread.start_new_thread

    def start_new_thread(function: Any, args: Any, kwargs: Any = None) -> int:
        def run(*a: Any, **k: Any) -> Any:
            _castmesh.debug_python_thread_starting(-1)  # its state is initialised before Python code runs
            return function(*a, **k)

        _castmesh.debug_python_thread_starting(1)
        try:
            return original(run, args, {} if kwargs is None else kwargs)
        except BaseException:
            _castmesh.debug_python_thread_starting(-1)
            raise

    _thread.start_new_thread = start_new_thread  # type: ignore[assignment]
    if getattr(threading, "_start_new_thread", None) is original:
        threading._start_new_thread = start_new_thread  # type: ignore[attr-defined]


def _thread_stack(d: Dict[str, Any]) -> ThreadStack:
    python = None if d["python"] is None else [PythonFrame(**f) for f in d["python"]]
    return ThreadStack(tid=d["tid"], name=d["name"], answered=d["answered"],
                       native=[NativeFrame(**f) for f in d["native"]], python=python,
                       python_truncated=d["python_truncated"], actor=d["actor"], actor_class=d["actor_class"],
                       message_type=d["message_type"])


def _proc(d: Dict[str, Any]) -> ProcStacks:
    return ProcStacks(rank=d["rank"], proc_id=d["proc_id"], pid=d["pid"], hostname=d["hostname"], error=d["error"],
                      python_error=d["python_error"], threads=[_thread_stack(t) for t in d["threads"]], text=d["text"])


def stacks(mesh: Union["ProcMesh", "ActorMesh[Any]"], timeout: float = 2.0, *, file_lines: bool = True) -> Stacks:
    """Every proc's stack dump (see the module's doc). ``timeout``: how long
    a proc waits for its threads (the call waits for a proc's reply about
    twice that, plus the symbol lookup); ``file_lines``: source lines of
    native frames via ``addr2line`` (slower on large debug builds). Call it in
    the controller that started the procs."""
    from .mesh import ActorMesh, ProcMesh
    from .errors import ProcError

    procs = mesh._proc_mesh if isinstance(mesh, ActorMesh) else mesh
    if not isinstance(procs, ProcMesh):
        raise TypeError(f"stacks() takes a ProcMesh or an ActorMesh spawned on one, not {type(mesh).__name__}")
    if procs._impl is None:
        raise ProcError("stack dumps of a proc mesh are taken in the controller that started it",
                        "FAILED_PRECONDITION")
    _install_python_hook()
    return Stacks(_proc(d) for d in _castmesh.debug_stacks(procs._impl, float(timeout), bool(file_lines)))


def _is_timeout(error: BaseException) -> bool:
    return isinstance(error, TimeoutError) or getattr(error, "code", None) == "DEADLINE_EXCEEDED"


@contextlib.contextmanager
def stacks_on_timeout(mesh: Union["ProcMesh", "ActorMesh[Any]"], timeout: float = 2.0, *,
                      file_lines: bool = False) -> Iterator[None]:
    """Attaches the mesh's stacks to a timeout raised inside the block (a
    call's ``get(timeout=...)``, a collective's
    :class:`~castmesh.errors.CommunicatorTimeoutError`, any error whose
    ``code`` is ``DEADLINE_EXCEEDED``): the error gets ``.stacks`` (a
    :class:`Stacks`, every thread of every proc) and, on Python 3.11+, a note
    with :meth:`Stacks.summary` that the traceback prints. Other errors pass
    through untouched. A dump that fails is noted instead; the timeout is
    re-raised either way::

        with castmesh.debug.stacks_on_timeout(trainers):
            trainers.step.call().get(timeout=600)
    """
    try:
        yield
    except BaseException as error:
        if not _is_timeout(error):
            raise
        try:
            dumps = stacks(mesh, timeout, file_lines=file_lines)
            setattr(error, "stacks", dumps)
            missing = getattr(error, "missing_ranks", None)
            note = "stacks at the timeout (every thread in error.stacks)"
            if missing:
                note += f"; ranks that did not arrive: {missing}"
            note += ":\n" + dumps.summary()
        except Exception as dump_error:  # noqa: BLE001 - the timeout is what the caller must see
            note = f"no stack dump at the timeout: {dump_error}"
        if hasattr(error, "add_note"):
            error.add_note(note)
        raise


def stack_signal() -> int:
    """The real-time signal a dump sends every thread (``SIGRTMIN+5`` on
    Linux): a thread that blocks it shows as not answering."""
    return int(_castmesh.debug_stack_signal())


def this_process(timeout: float = 2.0, *, file_lines: bool = True) -> ProcStacks:
    """This process's dump: every thread but the calling one."""
    _install_python_hook()
    return _proc(_castmesh.debug_this_process_stacks(float(timeout), bool(file_lines)))


_install_python_hook()
