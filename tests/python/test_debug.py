"""Stack dumps of procs (castmesh.debug.stacks; docs/observability.md,
"Stack dumps"): a proc whose actor is stuck in C code shows the native frame
and the Python frame that called it, whether the call holds the GIL
(ctypes.PyDLL) or released it (ctypes.CDLL); a thread that blocks the dump's
signal is reported as not answering, within the bound."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from typing import Callable, Iterator, Optional

import pytest

import castmesh
from castmesh import Actor, endpoint, this_host
from castmesh.debug import ProcStacks, ThreadStack

LIBC = ctypes.util.find_library("c") or "libc.so.6"


class Stuck(Actor):
    @endpoint
    def pause_holding_the_gil(self) -> None:
        libc = ctypes.PyDLL(LIBC)  # PyDLL: the GIL stays held during the call
        while True:
            libc.pause()  # each dump's signal wakes it; the loop parks it again

    @endpoint
    def pause_without_the_gil(self) -> None:
        libc = ctypes.CDLL(LIBC)  # CDLL: the GIL is released during the call
        while True:
            libc.pause()

    @endpoint
    def start_signal_blocking_thread(self, signum: int) -> int:
        started = threading.Event()
        native_id = []

        def run() -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
            native_id.append(threading.get_native_id())
            started.set()
            threading.Event().wait()  # for ever (the proc is stopped at the end)

        threading.Thread(target=run, daemon=True).start()
        started.wait()
        return native_id[0]


@pytest.fixture
def stuck() -> Iterator[castmesh.ActorMesh[Stuck]]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        yield procs.spawn("stuck", Stuck)
    finally:
        with warnings.catch_warnings():  # the stuck proc is killed after the grace period, as it must be
            warnings.simplefilter("ignore", RuntimeWarning)
            procs.stop().get(timeout=120)


def wait_for_thread(mesh: castmesh.ActorMesh[Stuck], found: Callable[[ThreadStack], bool]) -> ThreadStack:
    """Dumps until a thread matches (the hang guard is the deadline)."""
    deadline = time.monotonic() + 60
    last: Optional[ProcStacks] = None
    while time.monotonic() < deadline:
        dumps = castmesh.debug.stacks(mesh, timeout=2.0)
        assert len(dumps) == 1
        last = dumps[0]
        assert last.error is None, last.error
        for t in last.threads:
            if found(t):
                return t
    pytest.fail(f"no matching thread in the last dump:\n{last}")


def native_names(t: ThreadStack) -> str:
    return " ".join(f.function for f in t.native)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("endpoint_name", ["pause_holding_the_gil", "pause_without_the_gil"])
def test_an_actor_stuck_in_c_shows_the_native_and_the_python_frame(stuck: castmesh.ActorMesh[Stuck],
                                                                   endpoint_name: str) -> None:
    getattr(stuck, endpoint_name).broadcast()
    t = wait_for_thread(stuck, lambda t: t.python is not None
                        and any(f.function == endpoint_name for f in t.python))
    assert t.answered
    assert "pause" in native_names(t), str(t)
    assert t.python is not None and t.python[0].file.endswith("test_debug.py"), t.python
    assert t.actor.startswith("stuck"), t
    assert t.message_type, t
    dumps = castmesh.debug.stacks(stuck.slice(procs=0), timeout=2.0)
    text = str(dumps)
    assert f"{endpoint_name} at " in text and "python (most recent call first)" in text, text
    assert "native (most recent call first)" in text
    assert f"pid {dumps[0].pid}" in text


@pytest.mark.timeout(240)
def test_a_thread_that_blocks_the_signal_is_reported_as_not_answering(stuck: castmesh.ActorMesh[Stuck]) -> None:
    tid = stuck.start_signal_blocking_thread.call_one(castmesh.debug.stack_signal()).get(timeout=60)
    dumps = castmesh.debug.stacks(stuck, timeout=0.5)
    (t,) = [t for t in dumps[0].threads if t.tid == tid]
    assert not t.answered and t.native == []
    assert "did not answer within the bound" in str(dumps)
    others = [t for t in dumps[0].threads if t.tid != tid]
    assert others and all(t.answered for t in others), str(dumps)


@pytest.mark.timeout(120)
def test_this_process_has_python_stacks_for_its_threads() -> None:
    ready = threading.Event()
    stop = threading.Event()

    def waiting_here() -> None:
        ready.set()
        stop.wait()

    th = threading.Thread(target=waiting_here)
    th.start()
    try:
        ready.wait()
        dump = castmesh.debug.this_process(timeout=2.0, file_lines=False)
        (t,) = [t for t in dump.threads if t.tid == th.native_id]
        assert t.python is not None and any(f.function == "waiting_here" for f in t.python), str(dump)
        assert all(t.tid != threading.get_native_id() for t in dump.threads), "the caller leaves itself out"
        assert dump.pid == os.getpid()
    finally:
        stop.set()
        th.join()


def test_bad_arguments_get_clear_errors() -> None:
    with pytest.raises(TypeError, match="ProcMesh"):
        castmesh.debug.stacks("not a mesh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        castmesh.debug.this_process(timeout=0)


@pytest.mark.timeout(240)
def test_a_timeout_inside_stacks_on_timeout_carries_the_stuck_ranks_stacks(stuck: castmesh.ActorMesh[Stuck]) -> None:
    call = stuck.pause_holding_the_gil.call_one()
    wait_for_thread(stuck, lambda t: t.python is not None
                    and any(f.function == "pause_holding_the_gil" for f in t.python))
    with pytest.raises(TimeoutError) as caught:
        with castmesh.debug.stacks_on_timeout(stuck, timeout=2.0):
            call.get(timeout=0.1)  # the handler never returns: this times out whatever the machine's speed
    dumps = caught.value.stacks  # type: ignore[attr-defined]
    assert any(t.python and t.python[0].function == "pause_holding_the_gil" for t in dumps[0].threads), str(dumps)
    if sys.version_info >= (3, 11):
        note = "\n".join(caught.value.__notes__)
        assert "actor stuck" in note and "pause_holding_the_gil at" in note, note
    with pytest.raises(ValueError, match="not a timeout"):
        with castmesh.debug.stacks_on_timeout(stuck):
            raise ValueError("not a timeout")


_CHURN = r"""
import threading, castmesh
stop = False
def deep(n):
    return n if n < 2 else deep(n - 1) + 1
def churn():
    while not stop:
        deep(40)
        threading.Thread(target=lambda: None).start()  # states being created and torn down
threads = [threading.Thread(target=churn) for _ in range(2)]
for t in threads:
    t.start()
for _ in range(20):
    castmesh.debug.this_process(timeout=1.0, file_lines=False)
stop = True
for t in threads:
    t.join()
print("survived")
"""


@pytest.mark.timeout(280)
def test_dumps_while_python_threads_run_and_start_do_not_crash_the_process() -> None:
    # faulthandler reads every thread's frames without the GIL: the threads
    # are held while it does, and no dump is taken while a thread starts.
    proc = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "survived" in proc.stdout, (proc.returncode, proc.stderr[-3000:])
