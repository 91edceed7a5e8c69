"""Traces of message flow (castmesh.trace; docs/observability.md): one file
with a process per proc, user spans nested in their handlers, flow arrows
with both ends, per-thread times in order, and errors for misuse. Each
scenario runs in its own controller process so the trace holds only it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

import castmesh

CONTROLLER = textwrap.dedent("""
    import sys
    import numpy as np
    import castmesh
    from castmesh import Actor, collectives, endpoint, this_host
    from castmesh.rdma import RDMABuffer

    class Worker(Actor):
        @endpoint
        def work(self, x: int) -> int:
            with castmesh.span("inside work"):
                total = sum(range(1000))
            return x + total

        @endpoint
        @castmesh.traced(name="decorated")
        def other(self) -> str:
            return "ok"

        @endpoint
        def reduce(self) -> float:
            x = np.full(1024, 1.0, dtype=np.float32)
            collectives.current().allreduce(x)
            return float(x[0])

        @endpoint
        def weights(self) -> RDMABuffer:
            self.w = np.arange(4096, dtype=np.float32)
            return RDMABuffer(self.w)

        @endpoint
        def read(self, handle: RDMABuffer) -> float:
            w = np.zeros(4096, dtype=np.float32)
            handle.read_into(w).get()
            return float(w.sum())

    path = sys.argv[1]
    mode = sys.argv[2]
    if mode == "api":
        castmesh.trace.start(path)
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    workers = procs.spawn("workers", Worker)
    for i in range(5):
        workers.work.call(i).get(timeout=60)
    workers.other.broadcast()
    workers.slice(hosts=0, gpus=1).other.call_one().get(timeout=60)
    assert set(workers.reduce.call().get(timeout=60).values()) == {4.0}
    handle = workers.slice(hosts=0, gpus=0).weights.call_one().get(timeout=60)
    reader = workers.slice(hosts=1, gpus=1)
    assert reader.read.call_one(handle).get(timeout=60) == float(sum(range(4096)))
    # The reply leaves before read's handler slice is recorded: one more call
    # to the same actor (handled after read's slice ends) keeps stop() from
    # gathering in between.
    reader.other.call_one().get(timeout=60)
    with castmesh.span("controller side"):
        pass
    if mode == "api":
        print(castmesh.trace.stop())
""")


def run(tmp_path: Path, mode: str) -> Dict[str, Any]:
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    trace = tmp_path / "trace.json"
    env = dict(os.environ)
    if mode == "env":
        env["CASTMESH_TRACE"] = str(trace)
    proc = subprocess.run([sys.executable, str(script), str(trace), mode], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(trace) as f:
        return json.load(f)


def events(trace: Dict[str, Any], ph: str) -> List[Dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def process_names(trace: Dict[str, Any]) -> Dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events(trace, "M") if e["name"] == "process_name"}


def check_trace(trace: Dict[str, Any]) -> None:
    names = process_names(trace)
    # The controller and its four procs, one process each.
    assert len(names) == 5, names
    assert sum(1 for n in names.values() if n.startswith("controller")) == 1, names
    slices = events(trace, "X")
    # Per thread, times in order (a slice before those it encloses).
    by_thread: Dict[Any, List[float]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("X", "s", "f", "i", "b", "e"):
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e["ts"])
    for key, times in by_thread.items():
        assert times == sorted(times), key
    # User spans: 5 calls x 4 procs of "inside work", each inside a handler
    # slice of its own thread.
    inside = [e for e in slices if e["name"] == "inside work"]
    assert len(inside) == 20, len(inside)
    handlers = [e for e in slices if e["cat"] == "handler"]
    for span in inside:
        assert any(h["pid"] == span["pid"] and h["tid"] == span["tid"] and h["ts"] <= span["ts"]
                   and span["ts"] + span["dur"] <= h["ts"] + h["dur"] + 0.001 for h in handlers), span
    assert {e["pid"] for e in inside} == set(names) - {p for p, n in names.items() if n.startswith("controller")}
    # Python handlers are named by their endpoint ("Class.endpoint"), not by
    # the one C++ message that carries them; the user span sits in work's.
    assert sum(1 for h in handlers if h["name"] == "Worker.work") == 20
    assert not any(h["name"] == "castmesh::python::PyCall" for h in handlers)
    for span in inside:
        assert any(h["name"] == "Worker.work" and h["pid"] == span["pid"] and h["tid"] == span["tid"]
                   and h["ts"] <= span["ts"] for h in handlers), span
    assert {h["name"] for h in handlers} >= {"Worker.other", "Worker.reduce", "Worker.weights", "Worker.read"}
    # Spawns, in the controller: a slice per actor spawned (its mesh's name,
    # the registered class, the rank) and an async slice per proc, from the
    # allocation's start to the proc's join.
    controller = next(p for p, n in names.items() if n.startswith("controller"))
    spawns = [e for e in slices if e["cat"] == "spawn" and e["name"] == "spawn workers"]
    assert len(spawns) == 4 and {e["pid"] for e in spawns} == {controller}, spawns
    assert sorted(e["args"].get("value", 0) for e in spawns) == [0, 1, 2, 3]
    assert all(e["args"]["detail"] == "castmesh.PyActorHost" for e in spawns)
    proc_begins = [e for e in events(trace, "b") if e["cat"] == "spawn" and e["name"] == "spawn proc"]
    proc_ends = [e for e in events(trace, "e") if e["cat"] == "spawn" and e["name"] == "spawn proc"]
    assert len(proc_begins) == 4 and {e["pid"] for e in proc_begins} == {controller}, proc_begins
    assert {e["id"] for e in proc_begins} == {e["id"] for e in proc_ends}
    assert sorted(e["args"].get("value", 0) for e in proc_ends) == [0, 1, 2, 3]
    decorated = [e for e in slices if e["name"] == "decorated"]
    assert len(decorated) == 6  # a broadcast to 4, a call to 1, the call after read
    assert any(e["name"] == "controller side" for e in slices)
    # Every flow arrow has both ends, and they are in different processes:
    # each call and each answer crossed between the controller and a proc.
    starts = {e["id"]: e for e in events(trace, "s")}
    ends = {e["id"]: e for e in events(trace, "f")}
    assert starts.keys() == ends.keys()
    assert len(starts) >= 2 * 20, len(starts)  # 20 calls to work() and their 20 answers at least
    for flow_id, start in starts.items():
        assert start["pid"] != ends[flow_id]["pid"], flow_id
    # Sends are slices of their own, with the arrow's start inside.
    assert any(e["cat"] == "send" for e in slices)
    # The allreduce: one slice per rank with the same collective number, and
    # its steps as instants naming their path.
    allreduces = [e for e in slices if e["cat"] == "collective" and e["name"] == "allreduce"]
    assert len(allreduces) == 4, allreduces
    assert len({e["args"]["value"] for e in allreduces}) == 1
    assert "allreduce(sum, float32" in allreduces[0]["args"]["detail"]
    assert any(e["cat"] == "collective" for e in events(trace, "i"))
    # The RDMA read: an async slice whose end names the path.
    begins = [e for e in events(trace, "b") if e["cat"] == "rdma"]
    rdma_ends = [e for e in events(trace, "e") if e["cat"] == "rdma"]
    assert len(begins) == 1 and begins[0]["name"] == "rdma read" and begins[0]["args"]["value"] == 4096 * 4
    assert len(rdma_ends) == 1 and rdma_ends[0]["id"] == begins[0]["id"], rdma_ends
    assert rdma_ends[0]["args"]["detail"] in ("single_copy", "shared_segment", "socket", "ibverbs"), rdma_ends


@pytest.mark.timeout(300)
def test_a_trace_started_and_stopped_from_the_api(tmp_path: Path) -> None:
    check_trace(run(tmp_path, "api"))


@pytest.mark.timeout(300)
def test_a_trace_from_the_environment_is_written_at_exit(tmp_path: Path) -> None:
    check_trace(run(tmp_path, "env"))


SUPERVISION = textwrap.dedent("""
    import os
    import signal
    import sys
    import threading
    import time
    import castmesh
    from castmesh import Actor, endpoint, this_host

    class Doomed(Actor):
        @endpoint
        def die(self) -> None:
            raise SystemExit(3)

        @endpoint
        def pid(self) -> int:
            return os.getpid()

    failed = threading.Event()
    castmesh.unhandled_fault_hook = lambda failure: failed.set()
    castmesh.trace.start(sys.argv[1])
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    doomed = procs.spawn("doomed", Doomed)
    try:
        doomed.slice(gpus=0).die.call_one().get(timeout=30)
    except Exception:
        pass
    assert failed.wait(60)
    victim = doomed.slice(gpus=1)
    os.kill(victim.pid.call_one().get(timeout=30), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # until the controller saw the proc go
        try:
            victim.pid.call_one().get(timeout=5)
        except Exception:
            break
        time.sleep(0.1)
    print(castmesh.trace.stop())
""")


@pytest.mark.timeout(120)
def test_supervision_events_are_instants_where_they_are_observed(tmp_path: Path) -> None:
    script = tmp_path / "supervision.py"
    script.write_text(SUPERVISION)
    path = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(path) as f:
        trace = json.load(f)
    names = process_names(trace)
    controller = next(p for p, n in names.items() if n.startswith("controller"))
    instants = [e for e in events(trace, "i") if e["cat"] == "supervision"]
    failed = [e for e in instants if e["name"] == "actor failed"]
    # The actor's failure, in its own proc and in the controller its report reached.
    assert any(e["pid"] == controller for e in failed), instants
    assert any(e["pid"] != controller for e in failed), instants
    assert all("doomed" in e["args"]["detail"] for e in failed), failed
    # The killed proc, lost where the controller noticed.
    assert any(e["name"] == "proc lost" and e["pid"] == controller for e in instants), instants
    # The killed proc's records went with it; the survivor's handlers name
    # their endpoints, castmesh's own without its prefix (the constructor's call).
    handlers = {e["name"] for e in events(trace, "X") if e["cat"] == "handler"}
    assert {"Doomed.die", "Doomed.__init__"} <= handlers, handlers


def test_misuse_gets_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(castmesh.ProcError, match="no trace is recording"):
        castmesh.trace.stop()
    with pytest.raises(castmesh.ProcError, match="cannot write the trace to"):
        castmesh.trace.start(str(tmp_path / "missing" / "dir" / "trace.json"))
    castmesh.trace.start(str(tmp_path / "t.json"))
    try:
        with pytest.raises(castmesh.ProcError, match="already recording"):
            castmesh.trace.start(str(tmp_path / "u.json"))
    finally:
        summary = castmesh.trace.stop()
    assert summary["path"] == str(tmp_path / "t.json")
    assert not castmesh.trace.recording()


def test_spans_cost_nothing_visible_while_off() -> None:
    assert not castmesh.trace.recording()
    with castmesh.span("off"):
        pass

    @castmesh.traced
    def f(x: int) -> int:
        return x + 1

    assert f(1) == 2
