"""Jobs: who starts the host agents (docs/jobs.md). Monarch's ``monarch.job``
names.

A job owns the host agents of one or more named meshes of hosts and hands the
controller a :class:`JobState` whose attributes are those meshes, each a
:class:`castmesh.HostMesh` attached to its agents::

    from castmesh.job import SlurmJob
    job = SlurmJob({"trainers": 2}, job_start_timeout=600)
    hosts = job.state().trainers            # submits, waits, attaches
    procs = hosts.spawn_procs(per_host={"gpus": 4})
    job.dump("job.json")                    # a restarted controller: job_load("job.json").state()
    job.kill()                              # scancel

- :class:`LocalJob`: this machine (``this_host()``) under each name;
- :class:`ProcessJob`: every host an agent subprocess on this machine
  (127.0.0.1, free ports), for trying multi-host code locally;
- :class:`SlurmJob`: one ``sbatch`` job whose tasks run the agents.

Every job has its own mesh secret, handed to the agents in a 0600 file and
kept in the dump (written 0600), never on a command line or in the
environment of a scheduler's job.
"""

from __future__ import annotations

import abc
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import _castmesh, _runtime
from .host_mesh import HostMesh, attach_to_workers, this_host

__all__ = ["JobError", "JobState", "JobTrait", "LocalJob", "ProcessJob", "SlurmJob", "job_load"]

_DUMP_VERSION = 1
# How long an agent may take from its process (or Slurm task) starting to
# printing its address: an interpreter start plus the extension's import.
AGENT_START_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"castmesh host agent listening at (tcp:\S+)")
# Slurm job states after which the job runs no more.
_SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT", "REVOKED"}


class JobError(RuntimeError):
    """A job could not be submitted, started, attached or killed; the message
    says which job and why (Slurm's reason, an agent's log, the controller
    the agents are attached to)."""


class JobState:
    """The meshes of a job: one attribute (and item) per mesh name, each a
    :class:`castmesh.HostMesh` attached to that mesh's agents."""

    def __init__(self, meshes: Mapping[str, HostMesh]) -> None:
        self._meshes: Dict[str, HostMesh] = dict(meshes)

    def __getattr__(self, name: str) -> HostMesh:
        meshes = self.__dict__.get("_meshes", {})
        if name in meshes:
            return meshes[name]
        raise AttributeError(f"the job has no mesh {name!r} (its meshes: {', '.join(meshes) or 'none'})")

    def __getitem__(self, name: str) -> HostMesh:
        return self.__getattr__(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._meshes)

    def __repr__(self) -> str:
        return f"JobState({', '.join(f'{k}={v!r}' for k, v in self._meshes.items())})"


def _check_meshes(meshes: Mapping[str, int]) -> Dict[str, int]:
    """Mesh names become attributes of JobState: identifiers; sizes positive."""
    if not isinstance(meshes, Mapping) or not meshes:
        raise ValueError(f"meshes must be a non-empty dict of mesh name -> number of hosts, got {meshes!r}")
    out: Dict[str, int] = {}
    for name, count in meshes.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"mesh name {name!r} must be a Python identifier not starting with '_' "
                             f"(it becomes an attribute of the job's state)")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"mesh {name!r}: the number of hosts must be a positive int, got {count!r}")
        out[name] = count
    return out


def _write_private(path: Path, text: str) -> None:
    """Writes `text` to `path` with mode 0600 from the first byte (a temporary
    file renamed over it, so a reader never sees a partial or wider file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_process_secret: Optional[str] = None


def _job_secret() -> str:
    """The secret of a new job: the controller's own (CASTMESH_SECRET or
    CASTMESH_SECRET_FILE) when it has one; otherwise one random secret (32
    bytes) made for this process, shared by its jobs, because a controller
    process has one runtime and so one mesh secret."""
    global _process_secret
    if os.environ.get("CASTMESH_SECRET") or os.environ.get("CASTMESH_SECRET_FILE"):
        return str(_castmesh.resolve_mesh_secret(""))
    if _process_secret is None:
        _process_secret = secrets.token_hex(32)
    return _process_secret


def _check_controller_secret(secret: str, what: str) -> None:
    """A controller process has one runtime and one mesh secret: refuse,
    clearly, a job whose agents have another."""
    runtime = _runtime.current()
    if runtime is not None and not runtime.has_secret(secret):
        raise JobError(f"{what}: this controller already runs with another mesh secret (a process has one); "
                       f"use this job from a new process, or give every job the same CASTMESH_SECRET")


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _agent_address(log: Path) -> Optional[str]:
    """The address an agent printed in its log (None while it has not)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    match = _LISTENING.search(text)
    return match.group(1) if match else None


def _agent_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at an agent's address (the
    agent drops a connection that never proves the secret, harmlessly)."""
    match = re.fullmatch(r"tcp:(?://)?(?:[^@/]+@)?(\[[^\]]+\]|[^:/@\[\]]+):(\d+)", address)
    if match is None:
        return False
    try:
        with socket.create_connection((match.group(1).strip("[]"), int(match.group(2))), timeout=timeout):
            return True
    except OSError:
        return False


class JobTrait(abc.ABC):
    """A job: ``apply()`` starts its agents (once), ``state()`` attaches this
    controller to them, ``kill()`` ends them, ``dump(path)`` /
    :func:`job_load` let a restarted controller re-attach, ``active`` says
    whether it still runs, ``respawn_hosts(mesh)`` replaces lost hosts."""

    def __init__(self) -> None:
        self._applied = False
        self._killed = False
        self._secret = ""
        self._attached: Dict[str, HostMesh] = {}

    # ---- what each kind of job provides -------------------------------
    @abc.abstractmethod
    def _create(self) -> None:
        """Starts the agents (called once, by apply())."""

    @abc.abstractmethod
    def _kill(self) -> None:
        """Ends the agents."""

    @abc.abstractmethod
    def _is_active(self) -> bool:
        """Whether the agents still run (as far as the job can tell)."""

    @abc.abstractmethod
    def _mesh_names(self) -> List[str]:
        """The meshes, in order."""

    def _addresses(self, mesh: str) -> List[str]:
        """The agent addresses of `mesh`, one per host."""
        raise NotImplementedError

    def _replace_hosts(self, mesh: str, dead: List[int]) -> None:
        """Starts agents in place of those at the indices `dead` of `mesh`."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace hosts")

    def _host_alive(self, mesh: str, index: int) -> bool:
        return _agent_answers(self._addresses(mesh)[index])

    @abc.abstractmethod
    def _to_dict(self) -> Dict[str, Any]:
        """Everything a restarted controller needs, JSON-serializable."""

    @abc.abstractmethod
    def _from_dict(self, data: Dict[str, Any]) -> None:
        """Restores the running job from `_to_dict()`'s output."""

    def _label(self) -> str:
        return type(self).__name__

    # ---- the interface ---------------------------------------------------
    def apply(self) -> None:
        """Starts the job's agents (submits it); nothing when already done."""
        if self._killed:
            raise JobError(f"{self._label()} was killed; make a new job")
        if not self._applied:
            self._create()
            self._applied = True

    def state(self) -> JobState:
        """The job's meshes, each a HostMesh attached to its agents (applies
        the job first if needed). Fails naming the other controller when the
        agents are still attached to one."""
        self.apply()
        for name in self._mesh_names():
            if name not in self._attached:
                self._attached[name] = self._attach(name)
        return JobState({name: self._attached[name] for name in self._mesh_names()})

    def _attach(self, mesh: str) -> HostMesh:
        if not self._secret:  # LocalJob
            return this_host()
        _check_controller_secret(self._secret, f"{self._label()} mesh {mesh!r}")
        addresses = self._addresses(mesh)
        name = f"{self._label()}/{mesh} (pid {os.getpid()} on {socket.gethostname()})"
        hosts = attach_to_workers(workers=addresses, name=name, secret=self._secret)
        try:
            hosts.initialized.get()
        except Exception as error:  # noqa: BLE001 - ProcError and friends, re-raised with the job's name
            raise JobError(f"{self._label()}: attaching to the {len(addresses)} agent(s) of mesh {mesh!r} "
                           f"failed: {error}") from error
        return hosts

    def respawn_hosts(self, mesh_name: str) -> HostMesh:
        """Replaces the hosts of `mesh_name` whose agents are gone (Slurm: a
        new allocation of that many nodes; ProcessJob: new agent
        subprocesses) and returns the mesh attached again, the survivors
        included. Proc meshes started on the old HostMesh are stopped by the
        new one's ``shutdown()``; spawn new procs on it."""
        if mesh_name not in self._mesh_names():
            raise ValueError(f"the job has no mesh {mesh_name!r} (its meshes: {', '.join(self._mesh_names())})")
        self.apply()
        if not self._secret:
            return this_host()
        self._attached.pop(mesh_name, None)
        # An agent killed a moment ago may still accept connections while its
        # process exits (then resets them): when the attach fails, look again
        # after a pause, replacing what is gone by then.
        for attempt in range(3):
            dead = [i for i in range(len(self._addresses(mesh_name))) if not self._host_alive(mesh_name, i)]
            if dead:
                self._replace_hosts(mesh_name, dead)
            try:
                fresh = self._attach(mesh_name)
                break
            except JobError:
                if attempt == 2:
                    raise
                time.sleep(1.0)
        # The survivors' old procs are stopped by fresh.shutdown() too: it stops
        # every proc mesh of this controller on its agents (host_mesh.py).
        self._attached[mesh_name] = fresh
        return fresh

    def kill(self) -> None:
        """Ends the job: its agents and every proc they started. Idempotent."""
        if self._applied and not self._killed:
            # Stop this controller's procs cleanly first (their meshes stop
            # as asked, not as failures), then end the agents however they are.
            for hosts in self._attached.values():
                if not isinstance(hosts, HostMesh) or hosts._pending is None:
                    continue
                try:
                    hosts.shutdown().get(timeout=30)
                except Exception:  # noqa: BLE001 - the agents are ended below in any case
                    pass
            self._kill()
        self._killed = True
        self._attached.clear()

    @property
    def active(self) -> bool:
        """Whether the job was applied, not killed, and its agents still run."""
        return self._applied and not self._killed and self._is_active()

    def dump(self, path: str) -> None:
        """Writes what a restarted controller needs to re-attach
        (:func:`job_load`) to `path`, mode 0600: it holds the mesh secret."""
        self.apply()
        data = {"version": _DUMP_VERSION, "kind": type(self).__name__, "secret": self._secret, **self._to_dict()}
        _write_private(Path(path), json.dumps(data, indent=1) + "\n")


def job_load(path: str) -> JobTrait:
    """The job `dump(path)` wrote, ready for ``state()`` to re-attach to its
    running agents (which works once the controller that attached them has
    exited; while it is attached, ``state()`` fails naming it). The file must
    be private to this user (mode 0600 or 0400), as it holds the secret."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise JobError(f"job file {path} has mode {stat.S_IMODE(st.st_mode):04o}: it holds the mesh secret, "
                       f"so it must be private (chmod 600 {path})")
    if st.st_uid != os.getuid():
        raise JobError(f"job file {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as error:
        raise JobError(f"job file {path} is not a castmesh job dump: {error}") from None
    kinds = {cls.__name__: cls for cls in (LocalJob, ProcessJob, SlurmJob)}
    if not isinstance(data, dict) or data.get("version") != _DUMP_VERSION or data.get("kind") not in kinds:
        raise JobError(f"job file {path} is not a castmesh job dump of version {_DUMP_VERSION}")
    job: JobTrait = kinds[data["kind"]].__new__(kinds[data["kind"]])
    JobTrait.__init__(job)
    job._secret = data["secret"]
    job._from_dict(data)
    job._applied = True
    return job


# ---- LocalJob -------------------------------------------------------------


class LocalJob(JobTrait):
    """This machine as one host, under each of `hosts`' names
    (``this_host()``: its procs are local, with no ``hosts`` dimension)."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            hosts = (hosts,)
        self._names = list(_check_meshes({name: 1 for name in hosts}))

    def _create(self) -> None:
        pass

    def _kill(self) -> None:
        pass

    def _is_active(self) -> bool:
        return True

    def _mesh_names(self) -> List[str]:
        return list(self._names)

    def _to_dict(self) -> Dict[str, Any]:
        return {"hosts": self._names}

    def _from_dict(self, data: Dict[str, Any]) -> None:
        self._names = list(data["hosts"])


# ---- ProcessJob -----------------------------------------------------------


def _pid_runs_agent(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) castmesh host agent: a restarted
    controller checks this before trusting or signalling a dumped pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"castmesh.host" in f.read()
    except (OSError, IndexError):
        return False


class ProcessJob(JobTrait):
    """Every host an agent subprocess on this machine (``python -m
    castmesh.host`` at 127.0.0.1, a free port), for trying multi-host code
    locally. ``meshes`` maps each mesh name to its number of hosts; ``env``
    is added to the agents' (and so their procs') environment.

    The agents run in their own session: they outlive this controller (a
    restarted one re-attaches through :func:`job_load`) until ``kill()``."""

    def __init__(self, meshes: Dict[str, int], env: Optional[Mapping[str, str]] = None) -> None:
        super().__init__()
        self._meshes = _check_meshes(meshes)
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._dir = ""
        self._agents: Dict[str, List[Dict[str, Any]]] = {}  # mesh -> [{"address", "pid", "log"}]
        self._popen: Dict[int, subprocess.Popen] = {}
        self._serial = 0

    def _create(self) -> None:
        self._secret = _job_secret()
        self._dir = tempfile.mkdtemp(prefix="castmesh-processjob-")  # mode 0700
        _write_private(Path(self._dir) / "secret", self._secret + "\n")
        try:
            for mesh, count in self._meshes.items():
                self._agents[mesh] = self._start_agents(mesh, count)
        except BaseException:
            self._kill()
            raise

    def _start_agents(self, mesh: str, count: int) -> List[Dict[str, Any]]:
        env = dict(os.environ)
        env.pop("CASTMESH_SECRET", None)
        env.update(self._env)
        env["CASTMESH_SECRET_FILE"] = str(Path(self._dir) / "secret")
        env["PYTHONUNBUFFERED"] = "1"
        started: List[Dict[str, Any]] = []
        for _ in range(count):
            self._serial += 1
            log = Path(self._dir) / f"agent-{mesh}-{self._serial}.log"
            with open(log, "wb") as out:
                # Output to a file, not a pipe: the agent outlives this
                # controller, which would leave it writing to a closed pipe.
                proc = subprocess.Popen([sys.executable, "-m", "castmesh.host", "--address", "tcp://127.0.0.1:0"],
                                        env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            self._popen[proc.pid] = proc
            started.append({"address": "", "pid": proc.pid, "log": str(log)})
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        for agent in started:
            while not agent["address"]:
                agent["address"] = _agent_address(Path(agent["log"])) or ""
                if agent["address"]:
                    break
                if self._popen[agent["pid"]].poll() is not None:
                    raise JobError(f"ProcessJob: the agent of mesh {mesh!r} (pid {agent['pid']}) exited with "
                                   f"status {self._popen[agent['pid']].returncode} before listening:\n"
                                   f"{_tail(Path(agent['log']))}")
                if time.monotonic() > deadline:
                    raise JobError(f"ProcessJob: the agent of mesh {mesh!r} (pid {agent['pid']}) did not listen "
                                   f"within {AGENT_START_TIMEOUT_S:.0f}s:\n{_tail(Path(agent['log']))}")
                time.sleep(0.02)
        return started

    def _alive(self, pid: int) -> bool:
        proc = self._popen.get(pid)
        if proc is not None:
            return proc.poll() is None
        return _pid_runs_agent(pid)

    def _kill(self) -> None:
        pids = [a["pid"] for agents in self._agents.values() for a in agents if self._alive(a["pid"])]
        for pid in pids:
            try:  # The agents' procs die with them (PR_SET_PDEATHSIG / lifeline).
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for pid in pids:
            proc = self._popen.get(pid)
            if proc is not None:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            while _pid_runs_agent(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _is_active(self) -> bool:
        return any(self._alive(a["pid"]) for agents in self._agents.values() for a in agents)

    def _mesh_names(self) -> List[str]:
        return list(self._meshes)

    def _addresses(self, mesh: str) -> List[str]:
        return [a["address"] for a in self._agents[mesh]]

    def _host_alive(self, mesh: str, index: int) -> bool:
        return self._alive(self._agents[mesh][index]["pid"]) and super()._host_alive(mesh, index)

    def _replace_hosts(self, mesh: str, dead: List[int]) -> None:
        fresh = self._start_agents(mesh, len(dead))
        for index, agent in zip(dead, fresh):
            old = self._agents[mesh][index]
            if self._alive(old["pid"]):  # alive but not answering: make sure it is gone
                os.kill(old["pid"], signal.SIGKILL)
            self._agents[mesh][index] = agent

    def _label(self) -> str:
        return f"ProcessJob({os.path.basename(self._dir) or 'not applied'})"

    def _to_dict(self) -> Dict[str, Any]:
        return {"meshes": self._meshes, "env": self._env, "dir": self._dir, "agents": self._agents,
                "serial": self._serial}

    def _from_dict(self, data: Dict[str, Any]) -> None:
        self._meshes = dict(data["meshes"])
        self._env = dict(data["env"])
        self._dir = data["dir"]
        self._agents = {k: list(v) for k, v in data["agents"].items()}
        self._serial = int(data["serial"])
        self._popen = {}


# ---- SlurmJob -------------------------------------------------------------

# The task each agent runs (docs/jobs.md). It listens at the address its
# node's host name resolves to (the interface the cluster knows it by), or on
# every interface where the name resolves to loopback only (the agent then
# advertises a non-loopback address itself); one port per task of a node.
_AGENT_TASK = r"""#!/bin/bash
# One castmesh host agent: a task of a castmesh SlurmJob's srun step.
host=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk '$1 !~ /^127\./ {print $1; exit}') || true
exec "$CASTMESH_JOB_PYTHON" -m castmesh.host --address "tcp://${host:-0.0.0.0}:$((CASTMESH_JOB_PORT + SLURM_LOCALID))"
"""


def _scontrol_job(job_id: str) -> Dict[str, str]:
    """``scontrol show job -o`` as a dict ({} when Slurm no longer knows it)."""
    run = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        if "Invalid job id" in run.stderr:
            return {}
        raise JobError(f"scontrol show job {job_id} failed: {run.stderr.strip()}")
    fields: Dict[str, str] = {}
    for item in run.stdout.split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


class SlurmJob(JobTrait):
    """One ``sbatch`` job whose tasks run the host agents: ``meshes`` maps
    each mesh name to its number of nodes (``ntasks_per_node`` agents, so
    hosts, per node). The other arguments are Monarch's and map onto sbatch
    options (docs/jobs.md); ``python_exe`` is the interpreter on the nodes
    (with castmesh installed), ``port`` the first agent port on each node,
    ``log_dir`` a folder the nodes share with this controller (default
    ``~/.castmesh/jobs``) for the job's script, secret file and logs.

    ``state()`` waits for RUNNING (at most ``job_start_timeout`` seconds,
    then cancels and raises :class:`JobError` with Slurm's reason) and for
    every agent to listen, then attaches. ``kill()`` is ``scancel``."""

    def __init__(self, meshes: Dict[str, int], python_exe: str = "python", slurm_args: Sequence[str] = (),
                 port: int = 26600, job_name: str = "castmesh", ntasks_per_node: int = 1,
                 time_limit: Optional[str] = None, partition: Optional[str] = None, log_dir: Optional[str] = None,
                 exclusive: bool = True, gpus_per_node: Optional[int] = None, cpus_per_task: Optional[int] = None,
                 mem: Optional[str] = None, job_start_timeout: Optional[float] = None, account: Optional[str] = None,
                 qos: Optional[str] = None) -> None:
        super().__init__()
        self._meshes = _check_meshes(meshes)
        if isinstance(slurm_args, str):
            raise TypeError("slurm_args is a sequence of sbatch arguments, e.g. ['--constraint=a100']")
        if not 0 < int(port) < 65536:
            raise ValueError(f"port {port} is not a TCP port")
        if int(ntasks_per_node) < 1:
            raise ValueError(f"ntasks_per_node must be >= 1, got {ntasks_per_node}")
        if int(port) + int(ntasks_per_node) > 65536:
            raise ValueError(f"ports {port}..{port + ntasks_per_node - 1} do not all exist")
        if job_start_timeout is not None and not job_start_timeout > 0:
            raise ValueError(f"job_start_timeout must be positive (or None: wait as long as it takes), "
                             f"got {job_start_timeout}")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", job_name):
            raise ValueError(f"job_name {job_name!r}: use 1-64 characters of [A-Za-z0-9_.-]")
        self._spec: Dict[str, Any] = dict(
            python_exe=python_exe, slurm_args=list(slurm_args), port=int(port), job_name=job_name,
            ntasks_per_node=int(ntasks_per_node), time_limit=time_limit, partition=partition, log_dir=log_dir,
            exclusive=bool(exclusive), gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, mem=mem,
            job_start_timeout=job_start_timeout, account=account, qos=qos)
        self._dir = ""
        self._job_ids: List[str] = []
        self._agents: Dict[str, List[Dict[str, str]]] = {}  # mesh -> [{"address", "job", "node"}]

    # ---- submitting -----------------------------------------------------------
    def _sbatch_args(self, nodes: int, exclude: Sequence[str] = ()) -> List[str]:
        s = self._spec
        args = ["sbatch", "--parsable", f"--job-name={s['job_name']}", f"--nodes={nodes}",
                f"--ntasks-per-node={s['ntasks_per_node']}", f"--output={self._dir}/batch-%j.out",
                f"--chdir={self._dir}"]
        optional = [("--time", s["time_limit"]), ("--partition", s["partition"]),
                    ("--gpus-per-node", s["gpus_per_node"]), ("--cpus-per-task", s["cpus_per_task"]),
                    ("--mem", s["mem"]), ("--account", s["account"]), ("--qos", s["qos"])]
        args += [f"{flag}={value}" for flag, value in optional if value is not None]
        if s["exclusive"]:
            args.append("--exclusive")
        if exclude:
            args.append(f"--exclude={','.join(exclude)}")
        return args + list(s["slurm_args"]) + [str(Path(self._dir) / "batch.sh")]

    def _write_scripts(self) -> None:
        s = self._spec
        d = Path(self._dir)
        (d / "agent.sh").write_text(_AGENT_TASK)
        (d / "agent.sh").chmod(0o700)
        batch = "\n".join([
            "#!/bin/bash",
            f"# castmesh SlurmJob {s['job_name']}: one castmesh host agent per task (docs/jobs.md).",
            "set -eu",
            "# The mesh secret: a 0600 file in the job folder, never on a command line or in the job's",
            "# environment (sbatch keeps that environment in Slurm's state).",
            f"export CASTMESH_SECRET_FILE={shlex.quote(str(d / 'secret'))}",
            "unset CASTMESH_SECRET",
            f"export CASTMESH_JOB_PYTHON={shlex.quote(s['python_exe'])}",
            f"export CASTMESH_JOB_PORT={s['port']}",
            "export PYTHONUNBUFFERED=1",
            "# Tasks are independent hosts: one agent lost leaves the others running.",
            f"exec srun --kill-on-bad-exit=0 --output={shlex.quote(str(d))}/agent-%j-%t.out "
            f"{shlex.quote(str(d / 'agent.sh'))}",
            ""])
        (d / "batch.sh").write_text(batch)
        (d / "batch.sh").chmod(0o700)

    def _submit(self, nodes: int, exclude: Sequence[str] = ()) -> str:
        env = dict(os.environ)
        env.pop("CASTMESH_SECRET", None)  # never into the job's environment
        env.pop("CASTMESH_SECRET_FILE", None)
        try:
            run = subprocess.run(self._sbatch_args(nodes, exclude), capture_output=True, text=True, env=env,
                                 timeout=120)
        except FileNotFoundError:
            raise JobError("SlurmJob: sbatch not found (is this a Slurm login node? is Slurm on PATH?)") from None
        if run.returncode != 0:
            raise JobError(f"SlurmJob: sbatch refused the job: {run.stderr.strip() or run.stdout.strip()}")
        job_id = run.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise JobError(f"SlurmJob: unexpected sbatch output {run.stdout!r}")
        self._job_ids.append(job_id)
        return job_id

    def _wait_running(self, job_id: str) -> Dict[str, str]:
        timeout = self._spec["job_start_timeout"]
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.monotonic()
        while True:
            info = _scontrol_job(job_id)
            state = info.get("JobState", "")
            if state == "RUNNING":
                return info
            if not info or state in _SLURM_ENDED:
                raise JobError(f"SlurmJob: Slurm job {job_id} ended before running: {state or 'gone'} "
                               f"(reason {info.get('Reason', '?')})\n{_tail(Path(self._dir) / f'batch-{job_id}.out')}")
            if deadline is not None and time.monotonic() > deadline:
                reason = info.get("Reason", "?")
                subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
                raise JobError(f"SlurmJob: Slurm job {job_id} did not start within {timeout:g}s: it is {state} "
                               f"with reason {reason} (cancelled)")
            # Quick while a free cluster starts the job, gentle on slurmctld
            # while it waits in a queue.
            time.sleep(0.05 if time.monotonic() - started < 5 else 1.0)

    def _wait_agents(self, job_id: str, tasks: int) -> List[Tuple[str, str]]:
        """Each task's (address, node), by task id: srun's block
        distribution gives a node's tasks consecutive ids, in node order."""
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        logs = [Path(self._dir) / f"agent-{job_id}-{t}.out" for t in range(tasks)]
        found: List[Optional[str]] = [None] * tasks
        checked = time.monotonic()
        while True:
            for t, log in enumerate(logs):
                if found[t] is None:
                    found[t] = _agent_address(log)
            if all(found):
                break
            now = time.monotonic()
            if now - checked > 1.0:  # an agent that failed ends its task, maybe the job
                checked = now
                state = _scontrol_job(job_id).get("JobState", "")
                if state != "RUNNING":
                    raise JobError(self._agents_failed(job_id, logs, found, f"the job is {state or 'gone'}"))
            if now > deadline:
                raise JobError(self._agents_failed(job_id, logs, found, f"not within {AGENT_START_TIMEOUT_S:.0f}s"))
            time.sleep(0.05)
        nodes = self._job_nodes(job_id)
        per_node = self._spec["ntasks_per_node"]
        return [(str(found[t]), nodes[t // per_node] if t // per_node < len(nodes) else "") for t in range(tasks)]

    def _agents_failed(self, job_id: str, logs: List[Path], found: List[Optional[str]], why: str) -> str:
        missing = [t for t, f in enumerate(found) if f is None]
        detail = "\n".join(f"--- task {t} ({logs[t].name}):\n{_tail(logs[t])}" for t in missing[:4])
        return (f"SlurmJob: {len(missing)} of {len(logs)} agent(s) of Slurm job {job_id} did not start listening "
                f"({why}):\n{detail}\n{_tail(Path(self._dir) / f'batch-{job_id}.out')}")

    def _job_nodes(self, job_id: str) -> List[str]:
        nodelist = _scontrol_job(job_id).get("NodeList", "")
        run = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
        return run.stdout.split() if run.returncode == 0 else []

    def _start(self, nodes: int, exclude: Sequence[str] = ()) -> List[Dict[str, str]]:
        job_id = self._submit(nodes, exclude)
        try:
            self._wait_running(job_id)
            tasks = self._wait_agents(job_id, nodes * self._spec["ntasks_per_node"])
        except BaseException:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            raise
        return [{"address": address, "job": job_id, "node": node} for address, node in tasks]

    def _create(self) -> None:
        base = Path(self._spec["log_dir"] or Path.home() / ".castmesh" / "jobs")
        base.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.mkdtemp(prefix=f"{self._spec['job_name']}-", dir=str(base))  # mode 0700
        self._secret = _job_secret()
        _write_private(Path(self._dir) / "secret", self._secret + "\n")
        self._write_scripts()
        agents = self._start(sum(self._meshes.values()))
        per_node = self._spec["ntasks_per_node"]
        at = 0
        for mesh, count in self._meshes.items():
            self._agents[mesh] = agents[at:at + count * per_node]
            at += count * per_node

    # ---- running ----------------------------------------------------------
    def _replace_hosts(self, mesh: str, dead: List[int]) -> None:
        per_node = self._spec["ntasks_per_node"]
        lost_nodes = sorted({self._agents[mesh][i]["node"] for i in dead if self._agents[mesh][i]["node"]})
        nodes = -(-len(dead) // per_node)
        fresh = self._start(nodes, exclude=lost_nodes)
        for index, agent in zip(dead, fresh):
            self._agents[mesh][index] = agent

    def _kill(self) -> None:
        if not self._job_ids:
            return
        run = subprocess.run(["scancel", *self._job_ids], capture_output=True, text=True, timeout=60)
        if run.returncode != 0 and "Invalid job id" not in run.stderr:
            raise JobError(f"SlurmJob: scancel {' '.join(self._job_ids)} failed: {run.stderr.strip()}")
        # Done once Slurm has ended every task (KillWait after SIGTERM at most).
        deadline = time.monotonic() + 120
        for job_id in self._job_ids:
            while True:
                state = _scontrol_job(job_id).get("JobState", "")
                if not state or state in _SLURM_ENDED:
                    break
                if time.monotonic() > deadline:
                    raise JobError(f"SlurmJob: Slurm job {job_id} is still {state} 120s after scancel")
                time.sleep(0.1)

    def _is_active(self) -> bool:
        return any(_scontrol_job(j).get("JobState") == "RUNNING" for j in self._job_ids)

    def _mesh_names(self) -> List[str]:
        return list(self._meshes)

    def _addresses(self, mesh: str) -> List[str]:
        return [a["address"] for a in self._agents[mesh]]

    @property
    def job_ids(self) -> List[str]:
        """The Slurm job ids: the submitted job, then any of respawn_hosts."""
        return list(self._job_ids)

    def _label(self) -> str:
        return f"SlurmJob({','.join(self._job_ids) or self._spec['job_name']})"

    def _to_dict(self) -> Dict[str, Any]:
        return {"meshes": self._meshes, "spec": self._spec, "dir": self._dir, "job_ids": self._job_ids,
                "agents": self._agents}

    def _from_dict(self, data: Dict[str, Any]) -> None:
        self._meshes = dict(data["meshes"])
        self._spec = dict(data["spec"])
        self._dir = data["dir"]
        self._job_ids = list(data["job_ids"])
        self._agents = {k: list(v) for k, v in data["agents"].items()}
