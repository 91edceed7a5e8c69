"""Endpoints as Monarch has them: ``stream()`` yields one Future per member
in completion order, and ``concurrent_endpoint`` lets the async calls of one
actor interleave.

The tests that need interleaving wait for each other inside the actor: run
one at a time, their first call would never finish, and its ``get(timeout)``
(or the test's time limit) fails the test.
"""

from __future__ import annotations

import asyncio

import pytest

import castmesh
from castmesh import Actor, ActorError, Future, concurrent_endpoint, current_rank, endpoint, this_host


class Gate(Actor):
    """Member 0 answers only once released; the others at once."""

    def __init__(self, path: str = "") -> None:
        self.released = asyncio.Event()
        self.arrived = []
        self.both = asyncio.Event()
        self.cancelled = False
        self.path = path

    @concurrent_endpoint
    async def answer(self) -> int:
        rank = current_rank().rank
        if rank == 0:
            await self.released.wait()
        return rank

    @endpoint
    def release(self) -> None:
        self.released.set()

    @concurrent_endpoint
    async def meet(self, name: str) -> list:
        self.arrived.append(name)
        if len(self.arrived) < 2:
            await self.both.wait()
        else:
            self.both.set()
        return sorted(self.arrived)

    @concurrent_endpoint
    async def wait_released(self, value: int) -> int:
        await self.released.wait()
        return value * 2

    @concurrent_endpoint
    async def fail(self, message: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(message)

    @concurrent_endpoint(explicit_response_port=True)
    async def answer_later(self, port, value: int) -> None:
        await self.released.wait()
        port.send(value + 1)

    @concurrent_endpoint
    async def forever(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @concurrent_endpoint
    async def record(self, i: int) -> None:
        self.arrived.append(i)  # before the first await: in the order calls start
        await asyncio.sleep(0)

    @endpoint
    def recorded(self) -> list:
        return self.arrived

    @endpoint
    def slow(self, seconds: float) -> str:
        import time

        time.sleep(seconds)
        return "slow"

    def __cleanup__(self, exc) -> None:
        if self.path:
            with open(self.path + ".tmp", "w") as out:
                out.write(f"cancelled={self.cancelled}")
            import os

            os.replace(self.path + ".tmp", self.path)


@pytest.fixture(autouse=True)
def faults(monkeypatch):
    seen = []
    monkeypatch.setattr(castmesh, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"x": 4}) as mesh:
        yield mesh


@pytest.fixture()
def gates(procs, request):
    mesh = procs.spawn(request.node.name, Gate)
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_stream_futures_come_in_completion_order(gates):
    futures = list(gates.answer.stream())  # does not wait
    assert len(futures) == 4 and all(isinstance(f, Future) for f in futures)
    # Member 0 has not answered: the first three futures are the others.
    assert sorted(f.get(timeout=30) for f in futures[:3]) == [1, 2, 3]
    assert not futures[3].done()
    gates.slice(x=0).release.call_one().get(timeout=30)
    assert futures[3].get(timeout=30) == 0


@pytest.mark.timeout(60)
def test_stream_futures_can_be_awaited_and_carry_each_members_error(gates):
    async def main():
        return [await f for f in gates.ping.stream()]

    assert asyncio.run(main()) == ["pong"] * 4
    outcomes = [f.exception(30) for f in gates.fail.stream("no")]
    assert all(isinstance(e, ActorError) and e.remote_message == "no" for e in outcomes)
    # A timeout on one future leaves it readable later.
    pending = list(gates.slice(x=slice(0, 2)).answer.stream())
    assert pending[0].get(timeout=30) == 1
    with pytest.raises(TimeoutError):
        pending[1].get(timeout=0.2)
    gates.slice(x=0).release.call_one().get(timeout=30)
    assert pending[1].get(timeout=30) == 0


@pytest.mark.timeout(60)
def test_stream_timeout_fails_only_the_results_still_missing(gates):
    futures = list(gates.answer.stream(timeout=5))
    assert sorted(f.get(timeout=30) for f in futures[:3]) == [1, 2, 3]
    with pytest.raises(TimeoutError, match="no further result"):
        futures[3].get(timeout=30)  # member 0 is never released


@pytest.mark.timeout(60)
def test_concurrent_calls_of_one_actor_interleave(gates):
    one = gates.slice(x=2)
    first = one.meet.call_one("a")
    second = one.meet.call_one("b")
    # One at a time, "a" would wait for "b" forever.
    assert first.get(timeout=30) == ["a", "b"]
    assert second.get(timeout=30) == ["a", "b"]


@pytest.mark.timeout(60)
def test_concurrent_calls_from_one_sender_start_in_order(gates):
    one = gates.slice(x=1)
    for i in range(20):
        one.record.broadcast(i)
    calls = [one.record.call_one(i) for i in range(20, 40)]
    for call in calls:
        call.get(timeout=30)
    assert one.recorded.call_one().get(timeout=30) == list(range(40))


@pytest.mark.timeout(60)
def test_other_endpoints_run_while_a_concurrent_call_awaits(gates):
    waiting = gates.wait_released.call(21)
    assert gates.ping.call().get(timeout=30).values() is not None
    assert not waiting.done()
    gates.release.broadcast()
    assert list(waiting.get(timeout=30).values()) == [42] * 4


@pytest.mark.timeout(60)
def test_concurrent_endpoint_errors_go_to_the_caller_and_the_actor_keeps_running(gates, faults):
    one = gates.slice(x=1)
    with pytest.raises(ActorError) as info:
        one.fail.call_one("bad input").get(timeout=30)
    assert info.value.remote_message == "bad input"
    assert one.ping.call_one().get(timeout=30) == "pong"
    assert faults == []


@pytest.mark.timeout(60)
def test_concurrent_endpoint_with_an_explicit_response_port(gates):
    later = gates.slice(x=3).answer_later.call_one(1)
    assert gates.slice(x=3).ping.call_one().get(timeout=30) == "pong"
    gates.slice(x=3).release.call_one().get(timeout=30)
    assert later.get(timeout=30) == 2
    gates.release.broadcast()
    assert sorted(gates.answer_later.stream(5).values()) == [6] * 4


@pytest.mark.timeout(60)
def test_calls_still_running_are_cancelled_before_cleanup(procs, tmp_path):
    path = str(tmp_path / "cleanup")
    mesh = procs.slice(x=0).spawn("cancelled", Gate, path)
    running = mesh.forever.call_one()
    assert mesh.ping.call_one().get(timeout=30) == "pong"  # forever() has started
    mesh.stop().get(timeout=30)
    with open(path) as record:
        assert record.read() == "cancelled=True"
    # Its caller hears why instead of waiting forever.
    with pytest.raises(ActorError, match="actor stopped"):
        running.get(timeout=30)


def test_concurrent_endpoint_takes_only_async_methods():
    with pytest.raises(ValueError, match="async"):
        concurrent_endpoint(lambda self: None)
    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        async def method(self):
            return None

        concurrent_endpoint(endpoint(method))


def test_monarchs_endpoint_options_are_accepted_and_kept():
    async def method(self):
        return None

    for decorate in (endpoint, concurrent_endpoint):
        marked = decorate(propagate="cached", instrument=True, explicit_response_port=True)(method)
        assert (marked.propagate, marked.instrument, marked.explicit_response_port) == ("cached", True, True)


class Fragile(Actor):
    @concurrent_endpoint
    async def exit_now(self) -> None:
        await asyncio.sleep(0)
        raise SystemExit("bye")

    @concurrent_endpoint(explicit_response_port=True)
    async def forget_to_answer(self, port) -> None:
        raise ValueError("never answered")

    @endpoint
    def ping(self) -> str:
        return "pong"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["base_exception", "explicit_port_escape"])
def test_a_concurrent_call_can_fail_its_actor(procs, faults, how):
    import time

    mesh = procs.slice(x=1).spawn(f"fragile_{how}", Fragile)
    try:
        if how == "base_exception":
            with pytest.raises(ActorError, match="bye"):
                mesh.exit_now.call_one().get(timeout=30)
        else:
            pending = mesh.forget_to_answer.call_one()
        deadline = time.monotonic() + 30
        while not faults and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(faults) == 1 and isinstance(faults[0], castmesh.MeshFailure)
        assert ("bye" if how == "base_exception" else "never answered") in faults[0].report()
        with pytest.raises(castmesh.SupervisionError):
            mesh.ping.call_one().get(timeout=30)
        if how != "base_exception":
            # Its caller is told why no answer comes, instead of waiting forever.
            with pytest.raises(ActorError, match="never answered"):
                pending.get(timeout=30)
    finally:
        mesh.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_stream_of_a_mesh_reached_through_its_members_refs():
    # this_proc().spawn talks to the member's ref, not through a C++ mesh.
    from castmesh import this_proc

    local = this_proc().spawn("local_gate", Gate)
    try:
        assert [f.get(timeout=30) for f in local.ping.stream()] == ["pong"]
        # Its one result cannot come before 2 s: a 0.2 s stream timeout passes first.
        waiting = list(local.slow.stream(2, timeout=0.2))
        with pytest.raises(TimeoutError, match="no further result of slow"):
            waiting[0].get(timeout=30)
        assert [f.get(timeout=30) for f in local.slow.stream(0)] == ["slow"]
    finally:
        local.stop().get(timeout=30)
