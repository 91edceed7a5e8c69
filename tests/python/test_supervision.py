"""Supervision, as Monarch documents it: an actor whose endpoint raises a
BaseException that is not an Exception (or whose constructor raises) stops
and becomes a failed mesh member; the owner's ``__supervise__(failure)``
decides (truthy: handled); unhandled failures reach
``castmesh.unhandled_fault_hook`` in the controller, whose default logs and
exits non-zero; calls to a failed member raise ``SupervisionError``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

import castmesh
from castmesh import (Actor, ActorError, MeshFailure, ProcError, SupervisionError, current_rank, endpoint,
                      this_host, this_proc)


class Fragile(Actor):
    @endpoint
    def ping(self) -> int:
        return current_rank().rank

    @endpoint
    def die(self) -> None:
        raise SystemExit(3)

    @endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("stop here")

    @endpoint
    def oops(self) -> None:
        raise ValueError("an ordinary error")


class Parent(Actor):
    """Spawns a child in its own proc and supervises it."""

    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.seen = []
        self.child = None

    @endpoint
    def spawn_child(self) -> None:
        self.child = this_proc().spawn("child", Fragile)

    @endpoint
    def kill_child(self) -> None:
        try:
            self.child.die.call_one().get(timeout=30)
        except (ActorError, SupervisionError):
            pass

    @endpoint
    def seen_failures(self) -> list:
        return [(f.mesh_name, f.reason) for f in self.seen]

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure)
        return self.handle


def wait_for(predicate, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"gpus": 2}) as mesh:
        yield mesh



def test_error_classes():
    assert issubclass(SupervisionError, RuntimeError)
    assert issubclass(ProcError, SupervisionError)
    assert not issubclass(ActorError, SupervisionError)


@pytest.mark.timeout(60)
def test_an_exception_does_not_fail_the_actor(procs, faults):
    mesh = procs.spawn("sturdy", Fragile)
    with pytest.raises(ActorError, match="an ordinary error"):
        mesh.slice(gpus=0).oops.call_one().get(timeout=30)
    assert list(mesh.ping.call().get(timeout=30).values()) == [0, 1]
    assert faults == []
    mesh.stop().get(timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, what", [("die", "SystemExit: 3"), ("interrupt", "KeyboardInterrupt: stop here")])
def test_a_base_exception_fails_the_member_and_reaches_the_hook(procs, faults, how, what):
    mesh = procs.spawn(f"fragile_{how}", Fragile)
    with pytest.raises((ActorError, SupervisionError)):
        getattr(mesh.slice(gpus=1), how).call_one().get(timeout=30)
    wait_for(lambda: faults)
    assert len(faults) == 1
    failure = faults[0]
    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == f"fragile_{how}" and dict(failure.point) == {"gpus": 1}
    assert failure.points == [failure.point]
    assert what in failure.reason and what in failure.report() and "gpus=1" in str(failure)
    # Later calls to the failed member raise SupervisionError naming why.
    with pytest.raises(SupervisionError, match=what):
        mesh.slice(gpus=1).ping.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=30)
    # The other member keeps working.
    assert mesh.slice(gpus=0).ping.call_one().get(timeout=30) == 0
    mesh.stop().get(timeout=30)
    assert len(faults) == 1


@pytest.mark.timeout(60)
def test_supervise_that_handles_keeps_the_owner_running(procs, faults):
    parent = procs.slice(gpus=0).spawn("handling_parent", Parent, True)
    parent.spawn_child.call_one().get(timeout=30)
    parent.kill_child.call_one().get(timeout=30)
    seen = []
    wait_for(lambda: seen.extend(parent.seen_failures.call_one().get(timeout=30)) or seen)
    assert len(seen) == 1 and seen[0][0] == "child" and "SystemExit: 3" in seen[0][1]
    assert parent.seen_failures.call_one().get(timeout=30) == seen  # still running, told once
    assert faults == []  # handled: never reached the controller


@pytest.mark.timeout(60)
def test_unhandled_failure_fails_the_owner_and_goes_up(procs, faults):
    parent = procs.slice(gpus=1).spawn("giving_up_parent", Parent, False)
    parent.spawn_child.call_one().get(timeout=30)
    parent.kill_child.call_one().get(timeout=30)
    wait_for(lambda: faults)
    assert len(faults) == 1
    failure = faults[0]
    assert failure.mesh_name == "giving_up_parent"
    assert "unhandled failure of a mesh it owns" in failure.reason and "SystemExit: 3" in failure.reason
    with pytest.raises(SupervisionError):
        parent.seen_failures.call_one().get(timeout=30)


SCRIPT = textwrap.dedent(
    """
    import sys, castmesh
    from castmesh import Actor, endpoint, this_host

    class Doomed(Actor):
        @endpoint
        def die(self):
            raise SystemExit(5)

    import threading
    handled = threading.Event()

    def say(*words):  # one write per line: print() writes words and newline separately, so threads interleave
        sys.stdout.write(" ".join(map(str, words)) + "\\n")
        sys.stdout.flush()

    mode = sys.argv[1]
    if mode == "raising-hook":
        def hook(failure):
            raise RuntimeError("not handled: " + failure.mesh_name)
        castmesh.unhandled_fault_hook = hook
    elif mode == "quiet-hook":
        def hook(failure):
            say("HANDLED", failure.mesh_name)
            handled.set()
        castmesh.unhandled_fault_hook = hook
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    doomed = procs.spawn("doomed", Doomed)
    try:
        doomed.die.call_one().get(timeout=30)
    except Exception as error:
        say("CALL FAILED", type(error).__name__)
    handled.wait(60)        # an unhandled failure ends the process before this returns
    say("STILL ALIVE")
    procs.stop().get()
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, status", [("default", 1), ("raising-hook", 1), ("quiet-hook", 0)])
def test_unhandled_fault_hook_decides_the_controllers_fate(tmp_path, mode, status):
    script = tmp_path / "doomed.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=90)
    assert out.returncode == status, out.stdout + out.stderr
    if status:  # (the exit may come before or after the call's own error)
        assert "STILL ALIVE" not in out.stdout
        assert "unhandled mesh failure" in out.stderr and "doomed" in out.stderr
        assert "SystemExit: 5" in out.stderr
    else:
        assert "CALL FAILED" in out.stdout
        assert "HANDLED doomed" in out.stdout and "STILL ALIVE" in out.stdout


# Exits while Python finalizes slowly: an object freed with __main__ sleeps
# past the supervision thread's wake-up period (1 s). A thread that takes the
# GIL back after finalization has begun is ended by pthread_exit, which
# unwinds through pybind11's noexcept gil_scoped_release and aborts the
# process ("terminate called without an active exception"); the thread must
# have been joined at exit instead.
EXIT_SCRIPT = textwrap.dedent(
    """
    import time
    from castmesh import Actor, endpoint, this_proc

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    class SlowToFree:
        sleep = staticmethod(time.sleep)

        def __del__(self):
            self.sleep(2.5)

    mesh = this_proc().spawn("echo", Echo)  # starts the supervision thread
    assert mesh.echo.call_one(7).get(timeout=30) == 7
    slow = SlowToFree()
    print("EXITING", flush=True)
    """
)


@pytest.mark.timeout(120)
def test_exit_joins_the_supervision_thread_before_python_finalizes(tmp_path):
    script = tmp_path / "slow_exit.py"
    script.write_text(EXIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "EXITING" in out.stdout
    assert "terminate called" not in out.stderr, out.stderr
