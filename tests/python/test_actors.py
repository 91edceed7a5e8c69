"""Python actors on real worker procs: endpoints, adverbs, slicing, futures,
errors, killed workers, pickling and shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Optional

import pytest

import castmesh
from castmesh import (
    Actor,
    ActorError,
    Future,
    ProcError,
    ValueMesh,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @endpoint
    async def get(self) -> int:
        await asyncio.sleep(0)
        return self.value

    @endpoint
    def get_sync(self) -> int:
        return self.value

    @endpoint
    def where(self) -> tuple:
        point = current_rank()
        return (point.rank, dict(point), current_size(), os.getpid())

    @endpoint
    def echo(self, *args, **kwargs):
        return args, kwargs

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def call_other(self, other: "castmesh.ActorMesh[Counter]") -> list:
        return list(other.get_sync.call().get(timeout=30).values())

    @endpoint
    async def await_other(self, other: "castmesh.ActorMesh[Counter]") -> list:
        # an async endpoint awaiting another mesh on the actor's own loop
        values = await other.get.call()
        one = await other.slice(hosts=0, gpus=0).get_sync.call_one()
        return list(values.values()) + [one]

    def not_an_endpoint(self) -> None:
        pass


class Broken(Actor):
    def __init__(self) -> None:
        raise RuntimeError("constructor refuses")

    @endpoint
    def ping(self) -> str:
        return "pong"


@pytest.fixture(autouse=True)
def faults(monkeypatch):
    """Mesh failures reach castmesh.unhandled_fault_hook (default: exit);
    these tests record them instead."""
    seen = []
    monkeypatch.setattr(castmesh, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}) as mesh:
        yield mesh


@pytest.fixture()
def counters(procs, request):
    mesh = procs.spawn(request.node.name.replace("[", "_").replace("]", ""), Counter, 0)
    yield mesh
    mesh.stop()


def test_broadcast_then_call_gives_value_mesh(counters):
    counters.incr.broadcast(2)
    counters.incr.broadcast()
    values = counters.get.call().get(timeout=30)
    assert isinstance(values, ValueMesh)
    assert list(values.values()) == [3, 3, 3, 3]
    assert len(values) == 4
    points = [dict(point) for point, _ in values.items()]
    assert points == [{"hosts": 0, "gpus": 0}, {"hosts": 0, "gpus": 1}, {"hosts": 1, "gpus": 0}, {"hosts": 1, "gpus": 1}]
    assert values[{"hosts": 1, "gpus": 0}] == 3
    assert values.item(hosts=0, gpus=1) == 3


def test_sync_and_async_endpoints(counters):
    counters.slice(hosts=1, gpus=1).incr.broadcast(5)
    assert counters.slice(hosts=1, gpus=1).get_sync.call_one().get(timeout=30) == 5
    assert counters.slice(hosts=1, gpus=1).get.call_one().get(timeout=30) == 5
    assert counters.slice(hosts=0, gpus=0).get.call_one().get(timeout=30) == 0


def test_arguments_and_kwargs_round_trip(counters):
    one = counters.slice(hosts=0, gpus=0)
    args, kwargs = one.echo.call_one(1, "two", [3.0], key={"nested": (4, None)}).get(timeout=30)
    assert args == (1, "two", [3.0])
    assert kwargs == {"key": {"nested": (4, None)}}


def test_slicing_and_current_rank(counters, procs):
    where = counters.where.call().get(timeout=30)
    pids = set()
    for point, (rank, coords, sizes, pid) in where.items():
        assert rank == point.rank
        assert coords == dict(point)
        assert sizes == {"hosts": 2, "gpus": 2}
        pids.add(pid)
    assert pids == set(procs.pids)
    assert len(pids) == 4 and os.getpid() not in pids

    row = counters.slice(hosts=1)
    assert row.shape.labels == ["gpus"] and len(row) == 2
    coords = [w[1] for w in row.where.call().get(timeout=30).values()]
    assert coords == [{"hosts": 1, "gpus": 0}, {"hosts": 1, "gpus": 1}]
    column = counters.slice(gpus=slice(1, 2))
    assert column.shape.sizes == {"hosts": 2, "gpus": 1}
    assert [w[1]["gpus"] for w in column.where.call().get(timeout=30).values()] == [1, 1]
    with pytest.raises(ValueError, match="call_one"):
        row.get.call_one()
    with pytest.raises((ValueError, KeyError)):
        counters.slice(gpus=7)
    with pytest.raises((ValueError, KeyError)):
        counters.slice(nodes=0)


def test_choose_spreads_over_the_mesh(counters):
    for _ in range(8):
        counters.incr.choose(1).get(timeout=30)
    values = list(counters.get_sync.call().get(timeout=30).values())
    assert sum(values) == 8
    assert values == [2, 2, 2, 2]


class GatedWorker(Actor):
    """Answers with its rank; a call given a port first tells it (rank, gate
    port) and then waits until the gate port is sent something."""

    @endpoint
    def work(self, entered: Optional[castmesh.Port] = None) -> int:
        rank = current_rank().rank
        if entered is not None:
            gate, opened = castmesh.Channel.open()
            entered.send((rank, gate))
            opened.recv().get(timeout=120)
        return rank


@pytest.mark.timeout(120)
def test_choose_skips_a_busy_member_while_an_idle_one_exists(procs):
    """choose() picks the member with the fewest choose() requests in flight:
    the one held busy behind a gate is never chosen while others are idle
    (round-robin would reach it within len(mesh) calls)."""
    workers = procs.spawn("gated_workers", GatedWorker)
    entered, entries = castmesh.Channel.open()
    held = workers.work.choose(entered)
    busy, gate = entries.recv().get(timeout=30)
    try:
        # Each waits for its answer: a call that reached the busy member would not get one.
        answered = [workers.work.choose().get(timeout=30) for _ in range(2 * len(workers))]
        assert busy not in answered
        assert set(answered) == set(range(len(workers))) - {busy}  # the idle ones share the load
        assert not held.done()
    finally:
        gate.send("open")
    assert held.get(timeout=30) == busy
    # Idle again: it is chosen again.
    assert busy in {workers.work.choose().get(timeout=30) for _ in range(len(workers))}
    workers.stop().get(timeout=30)


def test_stream_yields_a_future_per_member_in_completion_order(counters):
    # Monarch: iterating stream() gives futures (.get() / await), one per member.
    futures = list(counters.where.stream())
    assert len(futures) == 4
    assert all(isinstance(f, Future) for f in futures)
    results = [f.get(timeout=30) for f in futures]
    assert sorted(r[0] for r in results) == [0, 1, 2, 3]
    # The values themselves, for code written against castmesh's earlier stream.
    assert sorted(r[0] for r in counters.where.stream().values()) == [0, 1, 2, 3]


def test_stream_is_sent_before_it_is_read_and_works_with_await(counters):
    before = sum(counters.get_sync.call().get(timeout=30).values())
    pending = counters.incr.stream(1)  # sent now, read later
    after = sum(counters.get_sync.call().get(timeout=30).values())
    assert after == before + 4
    assert len([f.get(timeout=30) for f in pending]) == 4

    async def main():
        awaited = [await f for f in counters.where.stream()]
        iterated = [r async for r in counters.where.stream(timeout=30).values()]
        return awaited, iterated

    awaited, iterated = asyncio.run(main())
    assert sorted(r[0] for r in awaited) == [0, 1, 2, 3]
    assert sorted(r[0] for r in iterated) == [0, 1, 2, 3]


def test_futures_are_awaitable(counters):
    counters.incr.broadcast(7)

    async def main():
        one = await counters.slice(hosts=0, gpus=1).get.call_one()
        every = await counters.get.call()
        both = await asyncio.gather(counters.slice(hosts=1, gpus=0).get.call_one(), counters.get_sync.choose())
        return one, list(every.values()), both

    one, every, both = asyncio.run(main())
    assert one == 7 and every == [7, 7, 7, 7] and both == [7, 7]


def test_get_timeout_then_result(counters):
    fut = counters.slice(hosts=0, gpus=0).sleep.call_one(0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)
    assert not fut.done()
    assert fut.get(timeout=30) == 0.5
    assert fut.done()


def test_endpoint_exception_is_actor_error_and_actor_survives(counters):
    one = counters.slice(hosts=1, gpus=1)
    with pytest.raises(ActorError) as info:
        one.fail.call_one("bad input").get(timeout=30)
    error = info.value
    assert error.remote_type == "builtins.ValueError"
    assert error.remote_message == "bad input"
    assert "in fail" in error.remote_traceback and "raise ValueError(message)" in error.remote_traceback
    assert isinstance(error.exception, ValueError)
    one.incr.broadcast(1)
    assert one.get.call_one().get(timeout=30) == 1
    with pytest.raises(ActorError, match="bad input"):
        counters.fail.call("bad input").get(timeout=30)


def test_unknown_endpoint_and_non_endpoint(counters):
    with pytest.raises(AttributeError, match="no endpoint"):
        counters.missing
    with pytest.raises(AttributeError, match="no endpoint"):
        counters.not_an_endpoint.call()


def test_constructor_failure_fails_the_member_and_reaches_callers(procs, faults):
    broken = procs.spawn("broken", Broken)
    # Each member failed: its owner (this controller's code) hears of each.
    deadline = time.monotonic() + 30
    while len(faults) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(f.point.rank for f in faults) == [0, 1, 2, 3]
    assert all(f.mesh_name == "broken" and "RuntimeError: constructor refuses" in f.reason for f in faults)
    # Calls to failed members raise SupervisionError, saying why.
    with pytest.raises(castmesh.SupervisionError, match="constructor refuses"):
        broken.ping.call().get(timeout=30)
    with pytest.raises(castmesh.SupervisionError, match="constructor refuses"):
        broken.slice(hosts=1, gpus=0).ping.call_one().get(timeout=30)


def test_actor_mesh_passed_to_another_actor(counters, procs):
    others = procs.spawn("others", Counter, 10)
    try:
        got = counters.slice(hosts=0, gpus=0).call_other.call_one(others).get(timeout=30)
        assert got == [10, 10, 10, 10]
    finally:
        others.stop()


def test_async_endpoint_awaits_another_mesh(counters, procs):
    others = procs.spawn("awaited", Counter, 3)
    try:
        got = counters.slice(hosts=1, gpus=0).await_other.call_one(others).get(timeout=30)
        assert got == [3, 3, 3, 3, 3]
    finally:
        others.stop()


def test_done_callback_runs_once_complete(counters):
    import threading

    seen = threading.Event()
    results = []
    fut = counters.slice(hosts=0, gpus=0).sleep.call_one(0.2)
    fut.add_done_callback(lambda f: (results.append(f.get(0)), seen.set()))
    assert seen.wait(30)
    assert results == [0.2]


def test_this_proc_spawns_in_the_controller():
    local = this_proc().spawn("local_counter", Counter, 41)
    local.incr.broadcast()
    assert local.get.call_one().get(timeout=30) == 42
    assert local.where.call_one().get(timeout=30)[3] == os.getpid()
    local.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_worker_fails_pending_calls_with_proc_error(faults):
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        counters = procs.spawn("victims", Counter, 0)
        victim = counters.slice(gpus=1)
        pid = victim.where.call_one().get(timeout=30)[3]
        pending = victim.sleep.call_one(60)
        time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ProcError) as info:
            pending.get(timeout=30)
        assert time.monotonic() - start < 10
        assert info.value.code in ("UNAVAILABLE", "ABORTED", "NOT_FOUND", "CANCELLED")
        # the surviving proc still answers; a new call to the dead one fails
        assert counters.slice(gpus=0).get.call_one().get(timeout=30) == 0
        with pytest.raises(ProcError):
            victim.get.call_one().get(timeout=30)
        # a mesh call that includes the dead point fails, naming the cause
        with pytest.raises(ProcError):
            counters.get.call().get(timeout=30)
        assert list(counters.slice(gpus=0).get.call().get(timeout=30).values()) == [0]
        # the owner (this controller's code) is told, once, which member failed
        deadline = time.monotonic() + 30
        while not faults and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(f.mesh_name, dict(f.point)) for f in faults] == [("victims", {"gpus": 1})]
        assert isinstance(info.value, castmesh.SupervisionError)


def test_stop_and_context_manager_leave_no_worker():
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        pids = procs.pids
        assert all(_alive(pid) for pid in pids)
        counters = procs.spawn("c", Counter, 0)
        assert list(counters.get.call().get(timeout=30).values()) == [0, 0]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    procs.stop()  # idempotent
    with pytest.raises(ProcError):
        procs.spawn("again", Counter, 0)


MAIN_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from castmesh import Actor, endpoint, this_host, this_proc

    class Payload:                      # a plain class defined in __main__
        def __init__(self, n):
            self.n = n

    class Doubler(Actor):               # an actor class defined in __main__
        def __init__(self, factor):
            self.factor = factor
        @endpoint
        def apply(self, payload, fn):
            return Payload(fn(payload.n) * self.factor)
        @endpoint
        def pid(self):
            return os.getpid()
        @endpoint
        def boom(self):
            raise KeyError("kaboom")

    offset = 3
    # an actor in the controller before any proc exists, then two proc meshes
    local = this_proc().spawn("local", Doubler, 1)
    first = this_host().spawn_procs(per_host={"gpus": 1})
    first.spawn("first", Doubler, 1)
    first.stop()
    del first
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print("LOCAL", local.pid.call_one().get(timeout=30) == os.getpid())
    mesh = procs.spawn("doubler", Doubler, 2)
    result = mesh.apply.call(Payload(5), lambda n: n + offset).get(timeout=30)
    print("RESULT", [p.n for p in result.values()], type(next(iter(result.values()))).__name__)
    mesh.boom.broadcast()              # no caller to raise to: the worker reports it
    print("PIDS", " ".join(str(p) for p in mesh.pid.call().get(timeout=30).values()))
    # exit without stop(): the runtime must still take the workers down
    """
)


def test_main_classes_closures_and_exit_without_stop(tmp_path):
    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["RESULT"] == "[16, 16] Payload"
    assert lines["LOCAL"] == "True"
    assert out.stderr.count("broadcast boom() raised builtins.KeyError: 'kaboom'") == 2, out.stderr
    pids = [int(p) for p in lines["PIDS"].split()]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import os, signal, threading, time
    from castmesh import Actor, endpoint, this_host

    class Sleeper(Actor):
        @endpoint
        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

    # Python keeps SIGINT ignored when its parent ignored it (a shell's
    # background job, e.g. `bash .ci/run &`); Ctrl-C handling is what is tested.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        mesh = procs.spawn("sleeper", Sleeper)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            mesh.sleep.call_one(60).get()
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED")
    """
)


def test_ctrl_c_interrupts_a_wait_and_stop_kills_busy_workers(tmp_path):
    script = tmp_path / "interrupt_script.py"
    script.write_text(INTERRUPT_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "INTERRUPTED"
    assert "were killed" in out.stderr  # the busy worker was killed by stop(), with a warning
