"""Procs started by an actor (``this_host().spawn_procs`` inside an actor):
the actor spawns on them, supervises what it spawns there, can stop them,
and they stop when the actor stops."""

from __future__ import annotations

import os
import time

import pytest

import castmesh
from castmesh import Actor, MeshFailure, ProcMesh, current_rank, endpoint, this_host


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        raise SystemExit(4)


class Manager(Actor):
    def __init__(self) -> None:
        self.procs = None
        self.leaves = None
        self.failures = []

    @endpoint
    def start(self, gpus: int) -> dict:
        self.procs = this_host().spawn_procs(per_host={"gpus": gpus})
        self.leaves = self.procs.spawn("leaves", Leaf)
        return {"is_proc_mesh": isinstance(self.procs, ProcMesh), "sizes": self.procs.sizes,
                "pids": list(self.leaves.pid.call().get(timeout=30).values()), "me": os.getpid(),
                "rank": current_rank().rank}

    @endpoint
    def kill_leaf(self) -> None:
        try:
            self.leaves.slice(gpus=0).die.call_one().get(timeout=30)
        except Exception:  # noqa: BLE001 - the leaf fails; its failure comes to __supervise__
            pass

    @endpoint
    def failures_seen(self) -> list:
        return [(f.mesh_name, dict(f.point)) for f in self.failures]

    @endpoint
    def stop_procs(self) -> None:
        self.procs.stop().get(timeout=60)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.timeout(120)
def test_an_actor_starts_procs_spawns_supervises_and_stops_them(faults):
    with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        manager = procs.spawn("manager", Manager)
        started = manager.start.call_one(2).get(timeout=60)
        assert started["is_proc_mesh"] and started["sizes"] == {"gpus": 2}
        pids = started["pids"]
        assert len(set(pids)) == 2 and started["me"] not in pids and os.getpid() not in pids
        assert all(alive(pid) for pid in pids)
        manager.kill_leaf.call_one().get(timeout=30)
        assert wait_until(lambda: manager.failures_seen.call_one().get(timeout=30))
        # Told once, to the actor that spawned the leaves, which handled it.
        assert manager.failures_seen.call_one().get(timeout=30) == [("leaves", {"gpus": 0})]
        assert faults == []
        manager.stop_procs.call_one().get(timeout=90)
        assert wait_until(lambda: not any(alive(pid) for pid in pids))
        assert faults == []


@pytest.mark.timeout(120)
def test_procs_of_an_actor_stop_when_it_stops(faults):
    with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        manager = procs.spawn("short_lived_manager", Manager)
        pids = manager.start.call_one(1).get(timeout=60)["pids"]
        assert all(alive(pid) for pid in pids)
        manager.stop().get(timeout=30)
        assert wait_until(lambda: not any(alive(pid) for pid in pids), 60)
    assert faults == []
