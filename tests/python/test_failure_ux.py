"""What a user sees when things fail: a constructor raising on every proc is
one error naming the points, with the first traceback and no castmesh
internals; a failure nobody handles ends the controller with status 1 even
when the script ends right after the failing call; world() started by hand
without a rendezvous says what to set; a call that times out says so in
plain words."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from castmesh import Actor, endpoint, this_host

CONSTRUCTOR = textwrap.dedent(
    """
    import castmesh
    from castmesh import Actor, endpoint, this_host

    castmesh.unhandled_fault_hook = lambda failure: None  # this script calls; nobody supervises

    class Bad(Actor):
        def __init__(self):
            raise ValueError("bad config")

        @endpoint
        def ping(self):
            return 1

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        procs.spawn("bad", Bad).ping.call().get(timeout=60)
    except Exception as error:
        print("RAISED", type(error).__name__)
        print(error)
    procs.stop().get()
    """
)


def _run(script: str, timeout: float = 90, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CASTMESH_RENDEZVOUS")}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env={**full_env, **env})


@pytest.mark.timeout(120)
def test_a_constructor_failing_on_every_proc_is_one_error():
    out = _run(CONSTRUCTOR)
    text = out.stdout + out.stderr
    assert "RAISED ProcError" in out.stdout, text
    # The members whose failure had arrived when the call failed (some or all of them), once each.
    named = re.search(r"(\d) members? of mesh 'bad' failed \(([^)]*)\): ABORTED: its constructor Bad\(\) raised "
                      r"ValueError: bad config\n--- first failure \(\{gpus=\d\}\) ---\n", out.stdout)
    assert named, text
    points = named.group(2).split(", ")
    assert len(points) == int(named.group(1)) == len(set(points)) and all(
        re.fullmatch(r"\{gpus=[0-3]\}", p) for p in points), points
    assert text.count("Traceback (most recent call last)") == 1, text  # the first one, once
    assert text.count("bad config") == 2, text  # the summary line and the traceback's last line
    for internal in ("castmesh.__init__", "_actor_server.py", "_replies.py", "unhandled actor failure", "remote actor"):
        assert internal not in text, (internal, text)


DOOMED = textwrap.dedent(
    """
    from castmesh import Actor, endpoint, this_host

    class Doomed(Actor):
        @endpoint
        def die(self):
            raise SystemExit(5)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        procs.spawn("doomed", Doomed).die.call_one().get(timeout=30)
    except Exception as error:
        print("CALL FAILED", type(error).__name__)
    print("END OF SCRIPT")  # and nothing waits for the failure's report
    """
)


@pytest.mark.timeout(600)
def test_the_default_fault_hook_ends_the_controller_with_status_1_every_time():
    for attempt in range(20):
        out = _run(DOOMED)
        assert out.returncode == 1, (attempt, out.stdout + out.stderr)
        # (The exit may come before or after the call's own error.)
        assert "exiting with status 1: unhandled mesh failure: mesh 'doomed'" in out.stderr


@pytest.mark.timeout(120)
def test_world_started_by_hand_says_what_to_set():
    script = "from castmesh import collectives\ncollectives.world(timeout=8)\n"
    out = _run(script, CASTMESH_RANK="1", CASTMESH_WORLD_SIZE="2")
    assert out.returncode != 0
    hint = out.stderr.find("RuntimeWarning: castmesh.collectives.world() has not met its peers after 5 s")
    assert hint >= 0, out.stderr
    assert "Set CASTMESH_RENDEZVOUS=tcp:HOST:PORT" in out.stderr[hint:]
    assert "TimeoutError" in out.stderr[hint:] or "Error" in out.stderr[hint:]  # then it gives up


class Slow(Actor):
    @endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.mark.timeout(120)
def test_a_call_that_times_out_says_so_plainly():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        slow = procs.spawn("slow", Slow)
        with pytest.raises(TimeoutError) as raised:
            slow.nap.call_one(3).get(timeout=0.2)
        message = str(raised.value)
        assert message.startswith("nap() got no answer from ") and message.endswith("within 0.2 s"), message
    finally:
        procs.stop().get()
