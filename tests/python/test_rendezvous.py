"""Procs started by a launcher join a Python controller (castmesh.Rendezvous).

The test plays the launcher: it starts ``python -m castmesh._worker`` itself
with the variables srun sets (SLURM_PROCID / SLURM_NTASKS) plus
CASTMESH_RENDEZVOUS and CASTMESH_SECRET, over TCP loopback. One process has
one controller address, so every test here shares the first Rendezvous's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Dict, Optional

import pytest

import castmesh
from castmesh import Actor, ProcError, current_rank, endpoint

SECRET = "pytest-rendezvous-secret"
LAUNCHER_PREFIXES = ("CASTMESH_", "SLURM_", "OMPI_", "PMI_", "JOB_COMPLETION_INDEX")


class Where(Actor):
    @endpoint
    def who(self) -> tuple:
        return os.getpid(), os.environ.get("SLURM_PROCID"), current_rank().rank

    @endpoint
    def secret_seen(self) -> tuple:
        """Whether user code can find the secret: os.environ, /proc/<pid>/environ."""
        initial = b""
        if os.path.exists(f"/proc/{os.getpid()}/environ"):
            with open(f"/proc/{os.getpid()}/environ", "rb") as f:
                initial = f.read()
        return "CASTMESH_SECRET" in os.environ, SECRET.encode() in initial


def launch(address: str, rank: str, size: str, extra: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Starts one worker as srun would (rank and size as the strings srun sets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(
        CASTMESH_RENDEZVOUS=address,
        CASTMESH_SECRET=SECRET,
        SLURM_PROCID=rank,
        SLURM_NTASKS=size,
        # The workers import this module to unpickle its actor classes.
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    env.update(extra or {})
    return subprocess.Popen([sys.executable, "-m", "castmesh._worker"], env=env, stderr=subprocess.PIPE, text=True)


def reap(*workers: subprocess.Popen) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=20)


@pytest.fixture(scope="module")
def rendezvous() -> castmesh.Rendezvous:
    return castmesh.Rendezvous("tcp:127.0.0.1:0", secret=SECRET)


def test_srun_style_workers_join_by_their_rank_and_serve_actors(rendezvous: castmesh.Rendezvous) -> None:
    assert rendezvous.address.startswith("tcp:127.0.0.1:")
    assert not rendezvous.address.endswith(":0")
    workers = {}
    for rank in (2, 0, 1):  # any order; the rank is what the launcher says
        workers[rank] = launch(rendezvous.address, str(rank), "3")
        time.sleep(0.05)
    try:
        procs = rendezvous.proc_mesh({"hosts": 1, "gpus": 3}, join_timeout=60)
        assert procs.pids == [workers[rank].pid for rank in range(3)]
        mesh = procs.spawn("where", Where)
        answers = mesh.who.call().get(timeout=30)
        for point, (pid, slurm_rank, rank) in answers.items():
            assert pid == workers[point.rank].pid
            assert slurm_rank == str(point.rank)
            assert rank == point.rank
        procs.stop()
        for rank, worker in workers.items():
            assert worker.wait(timeout=20) == 0, worker.communicate()[1]
    finally:
        reap(*workers.values())


def test_timeout_names_the_ranks_that_never_joined(rendezvous: castmesh.Rendezvous) -> None:
    worker = launch(rendezvous.address, "0", "2")  # rank 1 never comes
    try:
        with pytest.raises(ProcError) as raised:
            rendezvous.proc_mesh({"procs": 2}, join_timeout=3)
        message = str(raised.value)
        assert raised.value.code == "DEADLINE_EXCEEDED"
        # Rank 0 normally joined in time (a slow machine may not have started it yet).
        assert re.search(r"ranks? (0, )?1 of a mesh of 2 did not join", message), message
        if "joined: rank 0" in message:
            assert worker.wait(timeout=20) == 0  # the proc that joined is let go
    finally:
        reap(worker)


def test_worker_with_a_bad_rank_exits_with_a_clear_error(rendezvous: castmesh.Rendezvous) -> None:
    worker = launch(rendezvous.address, "one", "2")
    try:
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 2
        assert "SLURM_PROCID='one' is not a non-negative integer" in err
    finally:
        reap(worker)


def test_a_process_has_one_controller_address(rendezvous: castmesh.Rendezvous) -> None:
    again = castmesh.Rendezvous("tcp:127.0.0.1:0", secret=SECRET)
    assert again.address == rendezvous.address
    with pytest.raises(ProcError) as raised:
        castmesh.Rendezvous("unix:@castmesh-elsewhere", secret=SECRET)
    assert raised.value.code == "FAILED_PRECONDITION"
    assert rendezvous.address in str(raised.value)
    with pytest.raises(ProcError) as raised:
        castmesh.Rendezvous("tcp:127.0.0.1:0", secret="another-secret")
    assert "another mesh secret" in str(raised.value)


def test_a_launched_worker_erases_the_secret_before_user_code_runs(rendezvous: castmesh.Rendezvous) -> None:
    worker = launch(rendezvous.address, "0", "1")
    try:
        procs = rendezvous.proc_mesh({"procs": 1}, join_timeout=60)
        mesh = procs.spawn("secret_seen", Where)
        assert mesh.secret_seen.call_one().get(timeout=30) == (False, False)
        procs.stop()
        assert worker.wait(timeout=20) == 0, worker.communicate()[1]
    finally:
        reap(worker)
