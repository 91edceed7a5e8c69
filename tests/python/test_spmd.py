"""castmesh.spmd: torchrun's variables in every proc (the torch.distributed
bridge), on this host and on two loopback "hosts" (agents at 127.0.0.1 and
127.0.0.2, whose procs are two groups); torch.distributed's gloo backend
where torch is installed (not a CI dependency)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Dict

import pytest

import castmesh
from castmesh import Actor, endpoint
from castmesh.spmd import setup_torch_elastic_env

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


class Env(Actor):
    @endpoint
    def env(self) -> Dict[str, str]:
        return {k: os.environ.get(k, "") for k in KEYS}

    @endpoint
    def allreduce_with_torch(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.ones(1) * (int(os.environ["RANK"]) + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.item())


@pytest.mark.timeout(120)
def test_every_proc_of_this_host_gets_torchruns_variables() -> None:
    procs = castmesh.this_host().spawn_procs({"gpus": 4})
    try:
        setup_torch_elastic_env(procs)
        envs = procs.spawn("env", Env).env.call().get()
        ports = set()
        for point, env in envs.items():
            assert env["RANK"] == str(point.rank) and env["WORLD_SIZE"] == "4"
            assert env["LOCAL_RANK"] == str(point.rank) and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "0"
            assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
            ports.add(env["MASTER_PORT"])
        assert len(ports) == 1
        if importlib.util.find_spec("torch") is not None:
            assert set(procs.spawn("torch", Env).allreduce_with_torch.call().get().values()) == {10.0}
    finally:
        procs.stop().get()


SCRIPT = r"""
import os, sys
import castmesh
from castmesh.spmd import setup_torch_elastic_env
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from test_spmd import Env
hosts = castmesh.attach_to_workers(workers=sys.argv[2:])
procs = hosts.spawn_procs(per_host={"procs": 2})
setup_torch_elastic_env(procs, master_port=29511)
for point, env in procs.spawn("env", Env).env.call().get().items():
    print(point["hosts"], point["procs"], env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"],
          env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"])
hosts.shutdown().get()
"""


@pytest.mark.timeout(120)
def test_procs_of_two_hosts_are_two_groups(tmp_path) -> None:
    env = {**os.environ, "CASTMESH_SECRET": "test-spmd-secret"}
    agents = [subprocess.Popen([sys.executable, "-m", "castmesh.host", "--address", f"tcp://127.0.0.{k}:0"], env=env,
                               stdout=subprocess.PIPE, text=True) for k in (1, 2)]
    try:
        addresses = [agent.stdout.readline().split()[-1] for agent in agents]  # type: ignore[union-attr]
        script = tmp_path / "controller.py"
        script.write_text(SCRIPT)
        run = subprocess.run([sys.executable, str(script), __file__, *addresses], env=env, capture_output=True,
                             text=True, timeout=100)
        assert run.returncode == 0, run.stdout + run.stderr
        rows = sorted(tuple(line.split()) for line in run.stdout.splitlines() if line[:1].isdigit())
        assert rows == [
            ("0", "0", "0", "0", "0", "2", "4", "127.0.0.1", "29511"),
            ("0", "1", "1", "0", "1", "2", "4", "127.0.0.1", "29511"),
            ("1", "0", "2", "1", "0", "2", "4", "127.0.0.1", "29511"),
            ("1", "1", "3", "1", "1", "2", "4", "127.0.0.1", "29511"),
        ], run.stdout
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
