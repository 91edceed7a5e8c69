"""Two of Monarch's supervision tests (torchmonarch 0.7.0,
python/tests/test_actor_error.py: test_slice_supervision and
test_supervise_callback_handled), written anew for castmesh from what they
check:

- an endpoint that raises a BaseException which is not an Exception fails
  its actor (a SupervisionError to the caller), while an Exception is only
  the caller's error; slices that contain the failed member report it, slices
  that do not, and other meshes on the same procs, keep working;
- four supervisor actors each spawn a mesh named "error_actor" on one proc
  mesh (the same name four times, from inside actors); each sees the failure
  of every member of its own mesh in ``__supervise__`` (a MeshFailure naming
  the mesh and the rank) and, having handled them, keeps working.
"""

from __future__ import annotations

import asyncio
from typing import List

import pytest

from castmesh import ActorError, Actor, MeshFailure, SupervisionError, endpoint, this_host


class SimulatedFailure(BaseException):
    """Not an Exception: raised in an endpoint, it fails the actor (as in Monarch)."""


class Flaky(Actor):
    @endpoint
    async def fail(self) -> None:
        raise SimulatedFailure("simulated actor failure")

    @endpoint
    async def app_error(self) -> None:
        raise RuntimeError("an application error")

    @endpoint
    async def check(self) -> str:
        return "healthy"


class Healthy(Actor):
    @endpoint
    async def check(self) -> str:
        return "healthy"


@pytest.mark.timeout(150)
def test_slice_supervision(faults):
    async def run() -> None:
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        healthy = procs.spawn("healthy", Healthy)
        flaky = procs.spawn("error", Flaky)
        upper = flaky.slice(gpus=slice(2, 4))
        two = flaky.slice(gpus=2)
        three = flaky.slice(gpus=3)

        # An Exception is the caller's error; the actor stays healthy.
        with pytest.raises(ActorError, match="an application error"):
            await three.app_error.call()
        assert list((await three.check.call()).values()) == ["healthy"]

        # A BaseException fails the actor.
        with pytest.raises(SupervisionError):
            await three.fail.call()
        for containing in (flaky, three, upper):  # every mesh or slice holding gpus=3
            with pytest.raises(SupervisionError):
                await containing.check.call()
        assert list((await two.check.call()).values()) == ["healthy"]
        assert list((await flaky.slice(gpus=slice(0, 3)).check.call()).values()) == ["healthy"] * 3
        assert list((await healthy.check.call()).values()) == ["healthy"] * 4
        await procs.stop()

    asyncio.run(run())


class Supervisor(Flaky):
    def __init__(self, procs) -> None:
        self.mesh = procs.spawn("error_actor", Flaky)
        self.failures: List[MeshFailure] = []

    @endpoint
    async def subworker_fail(self) -> None:
        await self.mesh.check.call()
        try:
            await self.mesh.fail.call()
        except SupervisionError:
            return
        raise AssertionError("the failing call returned normally")

    @endpoint
    async def failures_seen(self) -> List[str]:
        return [str(f) for f in self.failures]

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True  # handled


@pytest.mark.timeout(150)
def test_supervise_callback_handled():
    async def run() -> None:
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        second = this_host().spawn_procs(per_host={"gpus": 4})
        supervisors = procs.spawn("supervisor", Supervisor, second)  # "error_actor" spawned 4 times on `second`

        await supervisors.subworker_fail.call()
        # __supervise__ runs between the supervisor's calls, so the reports
        # may still be on their way: ask again (a hang guard, not a timing).
        for _ in range(600):
            seen = [failures for _, failures in (await supervisors.failures_seen.call()).items()]
            if all(len(failures) >= 4 for failures in seen):
                break
            await asyncio.sleep(0.05)
        assert len(seen) == 4
        for failures in seen:
            assert len(failures) == 4, failures
            for rank in range(4):
                assert any("MeshFailure" in f and f"rank={rank}" in f and "error_actor" in f
                           for f in failures), (rank, failures)
        # Handled: the supervisors themselves are fine.
        assert list((await supervisors.check.call()).values()) == ["healthy"] * 4
        await second.stop()
        await procs.stop()

    asyncio.run(run())
