"""Hostile or careless use of a mesh from Python: procs started from a
thread that exits, and the mesh secret kept away from user code."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from castmesh import Actor, endpoint, this_host


class Probe(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def environment(self) -> tuple:
        """What user code can see of the environment: os.environ, and the block /proc/<pid>/environ shows."""
        path = f"/proc/{os.getpid()}/environ"
        initial = b""
        if os.path.exists(path):
            with open(path, "rb") as f:
                initial = f.read()
        return dict(os.environ), initial


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
def test_procs_spawned_from_a_thread_that_exits_keep_running():
    # The workers' lifetime follows the controller process, not the thread
    # that started them (Linux's parent-death signal is per thread).
    made = {}
    thread = threading.Thread(target=lambda: made.update(procs=this_host().spawn_procs(per_host={"gpus": 2})))
    thread.start()
    thread.join()
    with made["procs"] as procs:
        probes = procs.spawn("probes", Probe)
        pids = list(probes.pid.call().get(timeout=5).values())
        assert sorted(pids) == sorted(procs.pids)
        assert all(_alive(pid) for pid in pids)


@pytest.mark.timeout(60)
def test_procs_spawned_through_asyncio_to_thread_outlive_the_event_loop():
    async def spawn():
        return await asyncio.to_thread(this_host().spawn_procs, per_host={"gpus": 1})

    procs = asyncio.run(spawn())  # the executor's threads are gone when run() returns
    with procs:
        probes = procs.spawn("probes_to_thread", Probe)
        assert list(probes.pid.call().get(timeout=5).values()) == procs.pids


@pytest.mark.timeout(60)
def test_the_secret_is_not_in_a_workers_environment():
    with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        probes = procs.spawn("env_probes", Probe)
        environ, initial = probes.environment.call_one().get(timeout=5)
        assert environ.get("CASTMESH_RANK") == "0"  # the environment was read
        assert "CASTMESH_SECRET" not in environ
        assert b"CASTMESH_SECRET=" not in initial
