"""Lifecycle, as Monarch documents it: ``ActorMesh.stop()`` and
``ProcMesh.stop()`` return a Future (``await`` it or ``.get()`` it), and an
actor's ``__cleanup__(self, exc)`` runs when it stops, normally (``exc`` is
None) or because it failed (``exc`` is the exception)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import time

import pytest

import castmesh
from castmesh import Actor, Future, SupervisionError, current_rank, endpoint, this_host


def _record(path: pathlib.Path, text: str) -> None:
    """Writes a record the test polls for all at once: write_text creates the
    file before writing it, so a test polling from another process could read
    it empty. Names starting with "." do not match the test's globs."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


class Journal(Actor):
    """Writes what happened to it into a folder shared with the test."""

    def __init__(self, folder: str) -> None:
        self.folder = pathlib.Path(folder)

    @endpoint
    def ping(self) -> int:
        return current_rank().rank

    @endpoint
    def exit(self, code: int) -> None:
        raise SystemExit(code)

    def __cleanup__(self, exc) -> None:
        text = "None" if exc is None else f"{type(exc).__name__} {exc}"
        _record(self.folder / f"cleanup-{current_rank().rank}-{os.getpid()}", text)


class AsyncJournal(Actor):
    def __init__(self, folder: str) -> None:
        self.folder = pathlib.Path(folder)

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc) -> None:
        await asyncio.sleep(0)
        _record(self.folder / f"async-cleanup-{current_rank().rank}", repr(exc))


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(condition, timeout: float = 30.0) -> None:
    """Polls until condition() is truthy or the deadline passes (the assert
    that follows then says what is missing)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def cleanups(folder: pathlib.Path, prefix: str = "cleanup-") -> dict:
    return {p.name.split("-")[1]: p.read_text() for p in folder.glob(prefix + "*")}


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"gpus": 3}) as mesh:
        yield mesh



@pytest.mark.timeout(60)
def test_actor_mesh_stop_is_a_future_and_runs_cleanup(procs, tmp_path, faults):
    mesh = procs.spawn("journal", Journal, str(tmp_path))
    assert list(mesh.ping.call().get(timeout=30).values()) == [0, 1, 2]
    stopping = mesh.stop()
    assert isinstance(stopping, Future)
    assert stopping.get(timeout=30) is None
    # Every actor has run __cleanup__(None) by the time the future completes.
    assert cleanups(tmp_path) == {"0": "None", "1": "None", "2": "None"}
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=30)
    assert faults == []  # a stop is not a failure


@pytest.mark.timeout(60)
def test_stop_can_be_awaited_and_async_cleanup_runs(procs, tmp_path, faults):
    mesh = procs.spawn("async_journal", AsyncJournal, str(tmp_path))

    async def main() -> None:
        assert list((await mesh.ping.call()).values()) == ["pong"] * 3
        assert await mesh.stop() is None

    asyncio.run(main())
    assert sorted(p.read_text() for p in tmp_path.glob("async-cleanup-*")) == ["None"] * 3
    assert faults == []


@pytest.mark.timeout(60)
def test_stopping_a_slice_stops_only_its_actors(procs, tmp_path, faults):
    mesh = procs.spawn("partly", Journal, str(tmp_path))
    mesh.slice(gpus=-1).stop().get(timeout=30)
    assert list(cleanups(tmp_path)) == ["2"]
    assert list(mesh.slice(gpus=slice(0, 2)).ping.call().get(timeout=30).values()) == [0, 1]
    with pytest.raises(SupervisionError):
        mesh.slice(gpus=2).ping.call_one().get(timeout=30)
    mesh.stop().get(timeout=30)
    assert sorted(cleanups(tmp_path)) == ["0", "1", "2"]
    assert faults == []


@pytest.mark.timeout(60)
def test_cleanup_gets_the_exception_an_actor_failed_with(procs, tmp_path, faults):
    mesh = procs.spawn("failing", Journal, str(tmp_path))
    with pytest.raises(castmesh.ActorError, match="SystemExit"):
        mesh.slice(gpus=1).exit.call_one(7).get(timeout=30)
    # The caller hears of the failure before the actor has run __cleanup__;
    # wait for its (atomically written) record.
    _wait_for(lambda: cleanups(tmp_path))
    assert cleanups(tmp_path) == {"1": "SystemExit 7"}
    _wait_for(lambda: faults)
    assert [dict(f.point) for f in faults] == [{"gpus": 1}]
    mesh.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_proc_mesh_stop_is_a_future_awaitable_and_idempotent(tmp_path, faults):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("on_stopped_procs", Journal, str(tmp_path))
    assert list(mesh.ping.call().get(timeout=30).values()) == [0, 1]
    pids = procs.pids

    async def main() -> None:
        first = procs.stop()
        assert isinstance(first, Future)
        assert procs.stop() is first
        assert await first is None

    asyncio.run(main())
    assert not any(_alive(pid) for pid in pids)  # gone once the future completed
    assert cleanups(tmp_path) == {"0": "None", "1": "None"}  # each actor cleaned up as its proc stopped
    with pytest.raises(castmesh.ProcError):
        procs.spawn("late", Journal, str(tmp_path))
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=30)
    assert faults == []  # actors of a stopped proc mesh did not fail


@pytest.mark.timeout(120)
def test_proc_mesh_stop_get_and_context_manager(tmp_path, faults):
    with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        assert procs.spawn("one", Journal, str(tmp_path)).ping.call_one().get(timeout=30) == 0
    assert "stopped" in repr(procs)
    assert procs.stop().get(timeout=30) is None
    assert faults == []
