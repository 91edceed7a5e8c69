"""castmesh.rdma failure paths from Python: an owner killed while a read or
a write of its buffer is in flight fails that operation with an RdmaError
naming the dead owner (no hang), and a timeout fails an operation the owner
does not serve in time (a TimeoutError naming the operation), lands no late byte and leaves the buffer usable.

The owner is held with SIGSTOP so the operation is deterministically in
flight (not a race against its completion). That needs a path on which the
owner serves the operation: one-sided copies (the default same-host path)
read a stopped owner's memory without it, as a NIC would, so each test forces
the paths that message the owner, through the per-operation switches read by
this (the requesting) process."""

from __future__ import annotations

import os
import signal
import time

import pytest

import castmesh
from castmesh import Actor, endpoint, this_host
from castmesh.rdma import RdmaBuffer, RdmaError

np = pytest.importorskip("numpy")

N = 300_000  # floats: above the 64 KiB below which same-host operations use the socket anyway

# The same-host paths on which the owner takes part in every operation.
OWNER_SERVED_PATHS = {
    "single_copy_lease": {"rdma_one_sided": False},
    "shared_segment": {"rdma_one_sided": False, "rdma_single_copy": False},
    "socket": {"rdma_one_sided": False, "rdma_single_copy": False, "rdma_shared_segment": False},
}


class Owner(Actor):
    """Registers an array and says which process it lives in."""

    def __init__(self) -> None:
        self.weights = np.zeros(0, dtype=np.float32)

    @endpoint
    def publish(self, n: int) -> RdmaBuffer:
        self.weights = np.arange(n, dtype=np.float32)
        return RdmaBuffer(self.weights)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def head(self, k: int) -> list:
        return self.weights[:k].tolist()


@pytest.fixture()
def faults(monkeypatch):
    """These tests kill procs on purpose: the mesh failures they cause are expected."""
    seen = []
    monkeypatch.setattr(castmesh, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture()
def owner():
    """A fresh owner proc per test (a test may kill it); continued if a test left it stopped."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    actor = procs.spawn("owner", Owner)
    pid = actor.pid.call_one().get(timeout=60)
    yield actor, pid
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    procs.stop().get(timeout=60)


def _stop(pid: int) -> None:
    """SIGSTOP, then wait until every thread of `pid` is stopped (the signal is
    delivered asynchronously: until then the owner could still serve)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30  # a hang guard
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass  # a thread that ended meanwhile
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} did not stop")


def _start(buf: RdmaBuffer, operation: str, timeout: float):
    if operation == "read":
        return buf.read_into(np.empty(N, dtype=np.float32), timeout=timeout)
    return buf.write_from(np.full(N, 7.0, dtype=np.float32), timeout=timeout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", ["read", "write"])
@pytest.mark.parametrize("path", sorted(OWNER_SERVED_PATHS))
def test_owner_killed_mid_operation_fails_it_naming_the_owner(owner, faults, path, operation):
    actor, pid = owner
    buf = actor.publish.call_one(N).get(timeout=60)
    with castmesh.config.configured(**OWNER_SERVED_PATHS[path]):
        _stop(pid)  # the owner cannot serve it: the operation stays in flight
        pending = _start(buf, operation, timeout=600.0)  # only the owner's death may end it
        assert not pending.done(), "the operation finished while its owner was stopped"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RdmaError) as info:
            pending.get(timeout=60)  # a hang guard: the loss is an event, not a timer
    assert info.value.code == "UNAVAILABLE", info.value
    assert f"RDMA buffer owner proc {buf.owner} was lost" in str(info.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", ["read", "write"])
def test_timeout_fails_an_operation_the_owner_does_not_serve(owner, operation):
    actor, pid = owner
    buf = actor.publish.call_one(N).get(timeout=60)
    destination = np.full(N, -1.0, dtype=np.float32)
    with castmesh.config.configured(**OWNER_SERVED_PATHS["socket"]):
        _stop(pid)
        if operation == "read":
            pending = buf.read_into(destination, timeout=0.5)
        else:
            pending = buf.write_from(np.full(N, 7.0, dtype=np.float32), timeout=0.5)
        # The operation's own deadline, reported as a TimeoutError that says so (a
        # get() that merely ran out of its 30 s hang guard would say otherwise).
        with pytest.raises(TimeoutError, match=f"RDMA {operation} of {N * 4} bytes with proc .* "
                                               "did not finish within 500ms"):
            pending.get(timeout=30)
        os.kill(pid, signal.SIGCONT)
        # The owner now serves what it held: none of it may reach the failed read's destination.
        assert actor.head.call_one(2).get(timeout=60) in ([0.0, 1.0], [7.0, 7.0])
        if operation == "read":
            np.testing.assert_array_equal(destination, np.full(N, -1.0, dtype=np.float32))
        # The buffer still works afterwards.
        again = np.empty(N, dtype=np.float32)
        buf.read_into(again, timeout=60).get(timeout=60)
    if operation == "read":
        np.testing.assert_array_equal(again, np.arange(N, dtype=np.float32))
    else:  # a timed-out write may have landed, whole or not at all per chunk: never other values
        assert set(np.unique(again)) <= set(np.unique(np.concatenate([np.arange(N, dtype=np.float32), [7.0]])))
