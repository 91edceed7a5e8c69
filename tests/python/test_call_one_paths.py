"""call_one's one-member path (issue 37): the reply of the one member
completes the caller's slot straight from the cast tree's gather, and a
mesh's endpoint refs are made once. These check that path keeps call_one's
guarantees: taken while the peer dies, while the actor is busy, and with a
reply racing the caller's timeout."""

from __future__ import annotations

import os
import time

import pytest

from castmesh import _serial
from castmesh import Actor, ProcError, current_rank, endpoint, this_host


class Slow(Actor):
    def __init__(self) -> None:
        self.value = 0

    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def incr(self, by: int) -> None:
        self.value += by

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def block_until(self, path: str) -> int:
        """Keeps the actor busy until `path` exists (at most 60 s)."""
        for _ in range(1200):
            if os.path.exists(path):
                break
            time.sleep(0.05)
        return self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die_if(self, rank: int) -> int:
        if current_rank().rank == rank:
            os._exit(3)  # the proc dies mid-call
        return current_rank().rank


class Local:
    pass


@pytest.mark.parametrize("value", [
    ("ok", 3), ("ok", None), ((1, "a", 2.5), {}), ((), {}), ((1,), {"k": 2}), (("ok", 3), 4), ("ok", [1]),
    ((Local(),), {}), ("ok", Local()), ((1, (2, 3)), {}), (1, 2, 3), ("ok",),
])
def test_flat_check_is_a_subset_of_the_plain_check(value):
    # The fast check never lets through what the full one would send by cloudpickle.
    assert not _serial._is_flat(value) or _serial._is_plain(value)
    copy = _serial.loads(_serial.dumps(value))
    assert type(copy) is type(value) and len(copy) == len(value)


@pytest.fixture(scope="module")
def procs():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    yield procs
    procs.stop().get()


def test_same_endpoint_ref_answers_every_call(procs):
    mesh = procs.spawn("refs", Slow)
    one = mesh.slice(gpus=1)
    assert one.ping is one.ping  # made once per mesh
    assert [one.ping.call_one(i).get(timeout=30) for i in range(50)] == list(range(50))
    # The ref of one mesh does not leak into another (each slice calls its own member).
    mesh.slice(gpus=0).incr.broadcast(5)
    assert one.get.call_one().get(timeout=30) == 0
    assert mesh.slice(gpus=0).get.call_one().get(timeout=30) == 5


def test_call_one_while_actor_busy_keeps_order(procs, tmp_path):
    go = tmp_path / "go"
    one = procs.spawn("busy", Slow).slice(gpus=0)
    blocked = one.block_until.call_one(str(go))
    # Queued behind the busy endpoint: casts and calls interleaved, answered in order.
    futures = []
    for i in range(20):
        one.incr.broadcast(1)
        futures.append(one.get.call_one())
    assert all(not f.done() for f in futures)
    go.write_text("")
    assert blocked.get(timeout=60) == 0
    assert [f.get(timeout=30) for f in futures] == list(range(1, 21))


def test_reply_racing_a_timeout_arrives_later(procs, tmp_path):
    go = tmp_path / "go"
    one = procs.spawn("racer", Slow).slice(gpus=1)
    blocked = one.block_until.call_one(str(go))
    with pytest.raises(TimeoutError):
        blocked.get(timeout=0.01)
    go.write_text("")
    assert blocked.get(timeout=60) == 0  # the timed-out future still completes
    # Timeouts close to the reply time: each get either times out or gives
    # the right value, and a later get always gives it.
    for i in range(200):
        future = one.ping.call_one(i)
        try:
            assert future.get(timeout=0.0001 * (i % 5)) == i
        except TimeoutError:
            pass
        assert future.get(timeout=30) == i
        done = []
        future.add_done_callback(done.append)  # already completed: runs now
        assert done == [future]


def test_call_one_while_peer_dies(faults):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("mortal", Slow)
        doomed, survivor = mesh.slice(gpus=1), mesh.slice(gpus=0)
        # (Answered before the death is set off: a reply still in the dying
        # proc's write queue may be lost with it.)
        assert [doomed.ping.call_one(i).get(timeout=30) for i in range(10)] == list(range(10))
        dying = doomed.die_if.call_one(1)
        after = [doomed.ping.call_one(i) for i in range(10)]
        # The calls in flight when the peer dies fail; none hangs.
        with pytest.raises(ProcError):
            dying.get(timeout=30)
        for future in after:
            with pytest.raises(ProcError):
                future.get(timeout=30)
        with pytest.raises(ProcError):
            doomed.ping.call_one(0).get(timeout=30)
        assert survivor.die_if.call_one(1).get(timeout=30) == 0
    finally:
        procs.stop().get()
