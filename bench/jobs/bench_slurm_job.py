"""Time from ``SlurmJob(...).state()`` to the first call answered, on a real
Slurm cluster (scripts/slurm-up.sh: slurmctld and one slurmd per
network-namespace host on this machine), and how much of it is Slurm's own.

    sudo PYTHONPATH=build/dev/python build/venv-tools/bin/python bench/jobs/bench_slurm_job.py --hosts 2 4 --runs 5

Starts its own cluster (prefix ``cmbench``, as many nodes as the largest
``--hosts``) and removes it at the end. Phases of each run:

- ``sbatch``: submitting (sbatch returns the job id);
- ``to RUNNING``: until ``scontrol`` shows the job RUNNING (Slurm's scheduling);
- ``agents``: until every task's agent printed its address (srun's step
  launch on the nodes plus the agents' interpreter start);
- ``attach``: the HostMesh attach;
- ``first call``: ``spawn_procs(per_host={"procs": 1})``, an actor, one call.

Slurm's own share is ``sbatch`` + ``to RUNNING`` + the step launch (which is
part of ``agents``; an agent's start alone, measured on this machine as a
ProcessJob, is given beside it).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "cmbench"


def _phases_run(hosts: int, log_dir: str) -> Dict[str, float]:
    import castmesh
    from castmesh.job import SlurmJob

    marks: Dict[str, float] = {}
    job = SlurmJob({"hosts": hosts}, python_exe=sys.executable, log_dir=log_dir, job_name="bench",
                   job_start_timeout=60)
    # Timestamps between the job's own steps (the benchmark's only reach
    # inside; the job runs unchanged).
    submit, running, agents = job._submit, job._wait_running, job._wait_agents

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = fn(*args, **kwargs)
            marks[name] = time.perf_counter()
            return out
        return wrapper

    job._submit = timed("sbatch", submit)  # type: ignore[method-assign]
    job._wait_running = timed("running", running)  # type: ignore[method-assign]
    job._wait_agents = timed("agents", agents)  # type: ignore[method-assign]

    class Probe(castmesh.Actor):
        @castmesh.endpoint
        def ping(self) -> int:
            return castmesh.current_rank().rank

    t0 = time.perf_counter()
    try:
        mesh = job.state().hosts
        marks["attach"] = time.perf_counter()
        procs = mesh.spawn_procs(per_host={"procs": 1})
        answers = procs.spawn("probe", Probe).ping.call().get()
        marks["call"] = time.perf_counter()
        assert len(answers) == hosts
    finally:
        job.kill()
    order = ["sbatch", "running", "agents", "attach", "call"]
    out, last = {}, t0
    for name in order:
        out[name] = marks[name] - last
        last = marks[name]
    out["total"] = marks["call"] - t0
    return out


def _agent_start_local() -> float:
    """One agent's start alone (ProcessJob: interpreter + import + listen)."""
    from castmesh.job import ProcessJob

    t0 = time.perf_counter()
    job = ProcessJob({"hosts": 1})
    job.apply()
    elapsed = time.perf_counter() - t0
    job.kill()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, CASTMESH_SLURM_PREFIX=PREFIX)
    t = time.perf_counter()
    up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-up.sh"), str(max(args.hosts))], env=env,
                        capture_output=True, text=True)
    up_s = time.perf_counter() - t
    if up.returncode != 0:
        sys.exit(f"slurm-up.sh failed ({up.returncode}):\n{up.stderr}")
    os.environ.update(re.findall(r"^export (\w+)=(\S+)$", up.stdout, re.M))
    os.environ.pop("CASTMESH_SECRET", None)
    os.environ.pop("CASTMESH_SECRET_FILE", None)
    print(f"slurm-up.sh {max(args.hosts)} nodes: {up_s:.2f} s")
    try:
        with tempfile.TemporaryDirectory(prefix="castmesh-bench-jobs-") as logs:
            local = [_agent_start_local() for _ in range(3)]
            print(f"one agent's start alone (ProcessJob, 3 runs): median {statistics.median(local) * 1e3:.0f} ms")
            for hosts in args.hosts:
                runs: List[Dict[str, float]] = [_phases_run(hosts, logs) for _ in range(args.runs)]
                print(f"\n{hosts} hosts, {args.runs} runs (ms: median, min-max)")
                for phase in ["sbatch", "running", "agents", "attach", "call", "total"]:
                    values = [r[phase] * 1e3 for r in runs]
                    print(f"  {phase:8s} {statistics.median(values):7.0f}  {min(values):6.0f}-{max(values):.0f}")
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm-down.sh")], env=env)


if __name__ == "__main__":
    main()
