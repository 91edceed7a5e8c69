"""Controller scenarios for tests/python/test_jobs.py, each run as its own
process (a job's controller is a process: dump/job_load re-attach from a
second one, and a process has one castmesh runtime and mesh secret).

    python controller.py SCENARIO [ARGS...]

Prints progress lines the test reads ("READY", "OK", ...) and exits 0 when
every check of the scenario holds.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

import castmesh
from castmesh import Actor, collectives, endpoint
from castmesh.job import JobError, ProcessJob, SlurmJob, job_load


class Probe(Actor):
    """Reports where it runs and takes part in collectives."""

    @endpoint
    def where(self) -> tuple:
        return socket.gethostname(), os.getpid(), os.getppid()

    @endpoint
    def allreduce(self) -> float:
        x = np.full(1 << 12, float(castmesh.current_rank().rank + 1), dtype=np.float64)
        collectives.current().allreduce(x)
        return float(x[0])


class Trainer(Actor):
    """A stand-in for a training step: keeps a step count restored from the
    controller's checkpoint and reports its pid."""

    def __init__(self) -> None:
        self.step_count = 0

    @endpoint
    def restore(self, step: int) -> None:
        self.step_count = step

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def step(self) -> tuple:
        self.step_count += 1
        return self.step_count, os.getpid()


# Jobs this controller made; main() kills those not handed on (a failed
# check must not leave agents behind for the next test).
_made: List[Any] = []
_handed_on: List[Any] = []


def made(job: Any) -> Any:
    _made.append(job)
    return job


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"CHECK FAILED: {what}", flush=True)
        sys.exit(1)


def say(*words: Any) -> None:
    print(*words, flush=True)


def pid_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def call_across(hosts: castmesh.HostMesh, n_hosts: int, per_host: int) -> List[tuple]:
    """Procs on every host, a call to each, an allreduce across them."""
    procs = hosts.spawn_procs(per_host={"procs": per_host})
    check(procs.shape.sizes == {"hosts": n_hosts, "procs": per_host}, f"shape {procs.shape}")
    probes = procs.spawn("probe", Probe)
    where = [value for _, value in probes.where.call().get().items()]
    check(len(where) == n_hosts * per_host, f"every proc answered: {where}")
    n = n_hosts * per_host
    sums = set(probes.allreduce.call().get().values())
    check(sums == {float(n * (n + 1) // 2)}, f"allreduce {sums}")
    return where


# ---- ProcessJob ---------------------------------------------------------------


def scenario_process_three() -> None:
    """3 agent subprocesses, 2 procs each, calls and an allreduce across them."""
    job = made(ProcessJob({"hosts": 3}))
    hosts = job.state().hosts
    check(len(hosts) == 3, "three hosts")
    agent_pids = {h["agent_pid"] for h in hosts.hosts}
    check(len(agent_pids) == 3, f"three agents {agent_pids}")
    where = call_across(hosts, 3, 2)
    parents = {ppid for _, _, ppid in where}
    check(parents == agent_pids, f"procs are children of the three agents: {parents} vs {agent_pids}")
    check(job.active, "active while running")
    job.kill()
    check(not job.active, "not active after kill")
    check(all(pid_gone(p) for p in agent_pids | {pid for _, pid, _ in where}), "kill ended agents and procs")
    say("OK")


def scenario_process_hold(path: str) -> None:
    """Starts a job, uses it, dumps it, holds until told, exits without kill."""
    job = made(ProcessJob({"hosts": 2}))
    hosts = job.state().hosts
    call_across(hosts, 2, 1)
    job.dump(path)
    _handed_on.append(job)
    check(os.stat(path).st_mode & 0o777 == 0o600, "the dump is mode 0600")
    say("READY", " ".join(str(h["agent_pid"]) for h in hosts.hosts))
    sys.stdin.readline()
    say("EXITING")  # without kill(): the agents stay for the next controller


def scenario_load_attach(path: str) -> None:
    """A second controller re-attaches to a dumped job, uses it and kills it."""
    job = made(job_load(path))
    check(job.active, "the loaded job is active")
    hosts = job.state().hosts
    call_across(hosts, 2, 2)
    pids = [h["agent_pid"] for h in hosts.hosts]
    job.kill()
    check(all(pid_gone(p) for p in pids), "kill() of a loaded job ends its agents")
    say("OK")


def scenario_load_refused(path: str) -> None:
    """job_load + state() while the first controller is attached fails naming it."""
    job = job_load(path)
    try:
        job.state()
    except JobError as error:
        say("REFUSED", str(error).replace("\n", " "))
        return
    check(False, "state() attached although another controller holds the agents")


def scenario_process_respawn() -> None:
    """An agent is killed; respawn_hosts replaces it and the mesh works again."""
    castmesh.unhandled_fault_hook = lambda failure: None  # the loss is expected here
    job = made(ProcessJob({"hosts": 2}))
    hosts = job.state().hosts
    call_across(hosts, 2, 1)
    victim = hosts.hosts[1]["agent_pid"]
    survivor = hosts.hosts[0]["agent_pid"]
    os.kill(victim, signal.SIGKILL)
    check(pid_gone(victim), "the victim agent died")
    fresh = job.respawn_hosts("hosts")
    pids = [h["agent_pid"] for h in fresh.hosts]
    check(pids[0] == survivor and pids[1] != victim, f"host 1 replaced, host 0 kept: {pids}")
    call_across(fresh, 2, 2)
    check(job.state().hosts is fresh, "state() gives the refreshed mesh")
    job.kill()
    say("OK")


def _train(job: Any, steps: int, failures: Dict[int, Callable[[castmesh.HostMesh, Any], None]]) -> List[str]:
    """A training-style loop: every step calls every trainer; a step that
    fails (a lost proc or host) re-spawns and resumes from the checkpoint."""
    events: List[str] = []
    hosts = job.state().trainers
    checkpoint = 0

    def start(hosts: castmesh.HostMesh) -> Any:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        trainers = procs.spawn("trainer", Trainer)
        trainers.restore.call(checkpoint).get()
        return procs, trainers

    procs, trainers = start(hosts)
    while checkpoint < steps:
        if checkpoint in failures:
            failures.pop(checkpoint)(hosts, trainers)
        try:
            results = trainers.step.call().get(timeout=30)
        except Exception as error:  # noqa: BLE001 - a lost proc or host, recovered below
            events.append(f"step {checkpoint + 1} failed: {type(error).__name__}")
            try:
                procs.stop().get(timeout=30)
            except Exception:  # noqa: BLE001 - some of its procs are gone
                pass
            if not all(h["agent_pid"] and _agent_alive(h["agent_pid"]) for h in hosts.hosts):
                hosts = job.respawn_hosts("trainers")
                events.append("respawned hosts")
            procs, trainers = start(hosts)
            events.append(f"re-spawned procs at step {checkpoint}")
            continue
        steps_seen = {step for step, _ in results.values()}
        check(steps_seen == {checkpoint + 1}, f"every trainer at step {checkpoint + 1}: {steps_seen}")
        checkpoint += 1
    events.append(f"finished at step {checkpoint}")
    return events


def _agent_alive(pid: int) -> bool:
    return not pid_gone(pid, timeout=0.0)


def scenario_process_training() -> None:
    """Loses a proc at step 3 and a whole host (its agent) at step 6."""
    castmesh.unhandled_fault_hook = lambda failure: None  # the losses are expected here
    job = made(ProcessJob({"trainers": 2}))

    def kill_proc(hosts: castmesh.HostMesh, trainers: Any) -> None:
        pid = trainers.slice(hosts=1, gpus=0).pid.call_one().get()
        os.kill(pid, signal.SIGKILL)
        check(pid_gone(pid, timeout=20), f"proc {pid} was killed")

    def kill_agent(hosts: castmesh.HostMesh, trainers: Any) -> None:
        # Its procs die with it, a moment later (the kernel's parent-death
        # signal, or their lifeline pipe where there is none): the next step
        # must find them gone, not race with their end.
        doomed = list(trainers.slice(hosts=0).pid.call().get().values())
        os.kill(hosts.hosts[0]["agent_pid"], signal.SIGKILL)
        for pid in doomed:
            check(pid_gone(pid, timeout=20), f"proc {pid} died with its agent")

    try:
        events = _train(job, 8, {3: kill_proc, 6: kill_agent})
    finally:
        job.kill()
    for line in events:
        say("EVENT", line)
    check(any("re-spawned procs at step 3" in e for e in events), f"re-spawned after the lost proc: {events}")
    check("respawned hosts" in events, f"replaced the lost host: {events}")
    check(events[-1] == "finished at step 8", f"the loop finished: {events}")
    say("OK")


# ---- SlurmJob -----------------------------------------------------------------


def _slurm_job(log_dir: str, **kwargs: Any) -> SlurmJob:
    return SlurmJob({"hosts": 2}, python_exe=sys.executable, log_dir=log_dir, job_name="castmesh-test",
                    job_start_timeout=60, **kwargs)


def scenario_slurm_hold(path: str, log_dir: str) -> None:
    """2 nodes x 2 procs, calls and an allreduce across them, dump; exits
    without kill (the Slurm job keeps running for the next controller)."""
    start = time.monotonic()
    job = made(_slurm_job(log_dir))
    hosts = job.state().hosts
    say("ATTACHED", f"{time.monotonic() - start:.2f}")
    names = [h["hostname"] for h in hosts.hosts]
    check(len(set(names)) == 2, f"two distinct nodes: {names}")
    where = call_across(hosts, 2, 2)
    check({w[0] for w in where} == set(names), f"procs run on the nodes: {where}")
    job.dump(path)
    _handed_on.append(job)
    say("READY", job.job_ids[0], " ".join(names))


def scenario_slurm_load(path: str) -> None:
    """A second controller re-attaches to the running Slurm job, uses it and kills it."""
    job = made(job_load(path))
    check(job.active, "the loaded Slurm job is running")
    hosts = job.state().hosts
    call_across(hosts, 2, 2)
    job.kill()
    check(not job.active, "not active after kill")
    say("OK")


def scenario_slurm_respawn(log_dir: str) -> None:
    """An agent of a running Slurm job is killed; respawn_hosts gets a node of
    a new allocation in its place (the third node) and the mesh works again."""
    castmesh.unhandled_fault_hook = lambda failure: None  # the loss is expected here
    job = made(_slurm_job(log_dir))
    hosts = job.state().hosts
    before = [h["hostname"] for h in hosts.hosts]
    os.kill(hosts.hosts[1]["agent_pid"], signal.SIGKILL)  # the nodes share this machine's pid namespace
    fresh = job.respawn_hosts("hosts")
    after = [h["hostname"] for h in fresh.hosts]
    check(after[0] == before[0] and after[1] not in before, f"host 1 replaced by another node: {before} -> {after}")
    check(len(job.job_ids) == 2, f"a second allocation: {job.job_ids}")
    where = call_across(fresh, 2, 1)
    check({w[0] for w in where} == set(after), f"procs on the new nodes: {where}")
    job.kill()
    say("OK")


def scenario_slurm_down(log_dir: str) -> None:
    """A job in the DOWN partition fails with Slurm's reason once job_start_timeout expires."""
    job = SlurmJob({"hosts": 1}, python_exe=sys.executable, log_dir=log_dir, partition="down",
                   job_start_timeout=3)
    try:
        job.state()
    except JobError as error:
        say("REFUSED", str(error).replace("\n", " "))
        return
    check(False, "a job in a DOWN partition started")


def main() -> None:
    scenario = sys.argv[1]
    fn = globals().get("scenario_" + scenario.replace("-", "_"))
    if fn is None:
        sys.exit(f"unknown scenario {scenario}")
    try:
        fn(*sys.argv[2:])
    finally:
        for job in _made:
            if job not in _handed_on:
                job.kill()


if __name__ == "__main__":
    main()
