"""Controller scenarios for tests/python/test_hosts.py, each run as its own
process in the root network namespace (so the test process's own castmesh
runtime never takes an address on the test bridge).

    python controller.py SCENARIO AGENT_ADDRESS...

Prints progress lines the test reads ("READY", "FAILED_AFTER <s> <message>",
...) and exits 0 when every check of the scenario holds.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np

import castmesh
from castmesh import Actor, collectives, endpoint
from castmesh.rdma import RdmaBuffer


class Probe(Actor):
    """Reports where it runs and takes part in collectives and RDMA."""

    def __init__(self) -> None:
        self.data = np.arange(1 << 16, dtype=np.float32) + castmesh.current_rank().rank
        self.buffer = None

    @endpoint
    def where(self) -> tuple:
        return socket.gethostname(), os.getpid(), os.environ.get("CASTMESH_HOST_IDENTITY", "")

    @endpoint
    def rank(self) -> int:
        return castmesh.current_rank().rank

    @endpoint
    def allreduce(self) -> float:
        x = np.full(1 << 14, float(castmesh.current_rank().rank + 1), dtype=np.float64)
        collectives.current().allreduce(x)
        return float(x[0])

    @endpoint
    def allreduce_paths(self, n: int) -> tuple:
        """An allreduce of n doubles and the bytes each data path moved for it."""
        before = collectives.data_path_bytes()
        x = np.full(n, float(castmesh.current_rank().rank + 1), dtype=np.float64)
        collectives.current().allreduce(x)
        after = collectives.data_path_bytes()
        return float(x[0]), {path: after[path] - before[path] for path in after}

    @endpoint
    def expose(self) -> RdmaBuffer:
        self.buffer = RdmaBuffer(self.data)
        return self.buffer

    @endpoint
    def read(self, buffer: RdmaBuffer) -> tuple:
        out = np.empty(1 << 16, dtype=np.float32)
        result = buffer.read_into(out).get()
        return result.transport, float(out[1])

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"CHECK FAILED: {what}", flush=True)
        sys.exit(1)


def tls_credentials() -> dict:
    """The controller's mutual TLS files when the test sets TEST_TLS_DIR
    (scripts/make-test-certs.sh output), else none: the "controller"
    certificate and key, or those TEST_TLS_CERT / TEST_TLS_KEY / TEST_TLS_CA
    name (refusal tests)."""
    folder = os.environ.get("TEST_TLS_DIR")
    if not folder:
        return {}
    cert = os.environ.get("TEST_TLS_CERT", "controller")
    key = os.environ.get("TEST_TLS_KEY", cert)
    ca = os.environ.get("TEST_TLS_CA", "ca")
    return {"ca": f"{folder}/{ca}.crt", "cert": f"{folder}/{cert}.crt", "private_key": f"{folder}/{key}.key"}


def attach(addresses: list, **kwargs: object) -> castmesh.HostMesh:
    hosts = castmesh.attach_to_workers(workers=addresses, name=f"test-{sys.argv[1]}", **tls_credentials(), **kwargs)
    hosts.initialized.get()
    return hosts


def scenario_everything(addresses: list) -> None:
    """Attach, 2 procs per host, every adverb, allreduce and RDMA across hosts."""
    hosts = attach(addresses)
    check(len(hosts) == len(addresses), "one host per agent")
    names = [h["hostname"] for h in hosts.hosts]
    check(len(set(names)) == len(addresses), f"distinct host names {names}")
    procs = hosts.spawn_procs(per_host={"procs": 2}, bootstrap=lambda: os.environ.__setitem__("BOOTSTRAPPED", "1"))
    check(procs.shape.sizes == {"hosts": len(addresses), "procs": 2}, f"shape {procs.shape}")
    probes = procs.spawn("probe", Probe)
    where = probes.where.call().get()
    for point, (hostname, _pid, identity) in where.items():
        check(hostname == names[point["hosts"]], f"{point} runs on {hostname}, not {names[point['hosts']]}")
        check(identity == hosts.hosts[point["hosts"]]["host_identity"], "procs carry their agent's identity")
    identities = {identity for _, (_, _, identity) in where.items()}
    check(len(identities) == len(addresses), f"one identity per host: {identities}")
    # Adverbs.
    check(sorted(probes.rank.call().get().values()) == list(range(2 * len(addresses))), "call")
    check(probes.slice(hosts=1, procs=0).rank.call_one().get() == 2, "call_one on a slice")
    probes.sleep.broadcast(0.0)
    check(probes.rank.choose().get() in range(2 * len(addresses)), "choose")
    check(sorted(f.get() for f in probes.rank.stream()) == list(range(2 * len(addresses))), "stream")
    # Collectives across hosts (socket path between hosts, shared memory inside one).
    n = 2 * len(addresses)
    check(set(probes.allreduce.call().get().values()) == {float(n * (n + 1) // 2)}, "allreduce")
    # Inside a host, pairs keep shared memory / single copy; between hosts only sockets.
    big = 1 << 19  # 4 MiB of doubles: past the single-copy threshold
    paths = probes.allreduce_paths.call(big).get()
    check(set(v for v, _ in paths.values()) == {float(n * (n + 1) // 2)}, "large allreduce")
    same_host = sum(d["shared_memory"] + d["single_copy"] for _, d in paths.values())
    check(same_host > 0, f"same-host pairs keep their fast paths: {paths}")
    one_per_host = hosts.spawn_procs(per_host={"procs": 1}).spawn("lone", Probe)
    lone = one_per_host.allreduce_paths.call(big).get()
    for point, (value, moved) in lone.items():
        check(value == float(len(addresses) * (len(addresses) + 1) // 2), "allreduce, one proc per host")
        check(moved["socket"] > 0 and moved["shared_memory"] == 0 and moved["single_copy"] == 0,
              f"{point}: only sockets between hosts: {moved}")
    print(f"PATHS between hosts {[moved for _, moved in lone.values()]}", flush=True)
    # RDMA: a read from another host goes over the socket, one inside a host does not.
    buffer = probes.slice(hosts=0, procs=0).expose.call_one().get()
    far = probes.slice(hosts=1, procs=0).read.call_one(buffer).get()
    near = probes.slice(hosts=0, procs=1).read.call_one(buffer).get()
    check(far == ("socket", 1.0), f"cross-host read {far}")
    check(near[0] != "socket" and near[1] == 1.0, f"same-host read {near}")
    print(f"RDMA far={far[0]} near={near[0]}", flush=True)
    hosts.shutdown().get()
    print("OK", flush=True)


def scenario_lose_host(addresses: list) -> None:
    """A pending call on the last host fails once that host is gone (the
    test kills it or partitions it); then procs re-spawn on the survivors."""
    hosts = attach(addresses)
    procs = hosts.spawn_procs(per_host={"procs": 2})
    probes = procs.spawn("probe", Probe)
    castmesh.unhandled_fault_hook = lambda failure: None  # the loss is expected here
    victim = probes.slice(hosts=len(addresses) - 1, procs=0)
    pending = victim.sleep.call_one(600.0)
    print("READY", flush=True)
    sys.stdin.readline()  # the test has made the host vanish
    start = time.monotonic()
    try:
        pending.get(timeout=60)
        check(False, "the call on the lost host returned")
    except Exception as error:  # noqa: BLE001 - any error naming the host
        elapsed = time.monotonic() - start
        print(f"FAILED_AFTER {elapsed:.2f} {error}", flush=True)
    survivors = hosts.slice(hosts=slice(0, len(addresses) - 1))
    again = survivors.spawn_procs(per_host={"procs": 1}).spawn("again", Probe)
    check(sorted(again.rank.call().get().values()) == list(range(len(addresses) - 1)), "re-spawn on survivors")
    print("RESPAWNED", flush=True)
    survivors.shutdown().get()
    print("OK", flush=True)


def scenario_hold(addresses: list) -> None:
    """Stays attached until told to go (a second controller is refused meanwhile)."""
    attach(addresses)
    print("READY", flush=True)
    sys.stdin.readline()
    print("OK", flush=True)


def scenario_attach_fails(addresses: list) -> None:
    """Attaching must fail; prints the error. TEST_ATTACH_TIMEOUT: longer
    than a connection's own 5 s handshake deadline where that is the error
    the test reads."""
    try:
        attach(addresses, attach_timeout=float(os.environ.get("TEST_ATTACH_TIMEOUT", "5")))
    except Exception as error:  # noqa: BLE001 - the message is what the test checks
        print(f"ERROR {type(error).__name__}: {error}", flush=True)
        return
    print("ATTACHED", flush=True)
    sys.exit(1)


def scenario_call_across_rotation(addresses: list) -> None:
    """One proc per host answers before and after the test replaces the
    agents' certificate files (its connections stay up); then the procs
    stop and the agents stay for the next controller."""
    hosts = attach(addresses)
    procs = hosts.spawn_procs(per_host={"procs": 1})
    probes = procs.spawn("probe", Probe)
    check(len(probes.rank.call().get()) == len(addresses), "call before")
    print("READY", flush=True)
    sys.stdin.readline()  # the test has rotated the files
    check(len(probes.rank.call().get()) == len(addresses), "call after, on the same connections")
    procs.stop().get()
    print("OK", flush=True)


def scenario_attach(addresses: list) -> None:
    """Attaching and one proc per host work; no shutdown (the agents stay)."""
    hosts = attach(addresses)
    procs = hosts.spawn_procs(per_host={"procs": 1})
    check(len(procs.spawn("probe", Probe).rank.call().get()) == len(addresses), "call")
    procs.stop().get()
    print("OK", flush=True)


def scenario_bootstrap_raises(addresses: list) -> None:
    """A bootstrap that raises fails spawn_procs with its error."""
    hosts = attach(addresses)

    def broken() -> None:
        raise RuntimeError("no GPU driver here")

    try:
        hosts.spawn_procs(per_host={"procs": 2}, bootstrap=broken)
    except castmesh.ProcError as error:
        check("no GPU driver here" in str(error), f"the bootstrap's error is reported: {error}")
        print(f"ERROR {error}".splitlines()[0], flush=True)
    else:
        check(False, "spawn_procs succeeded with a raising bootstrap")
    print("OK", flush=True)


def scenario_leave(addresses: list) -> None:
    """Starts procs and exits without stopping them or shutting down."""
    hosts = attach(addresses)
    hosts.spawn_procs(per_host={"procs": 2}).spawn("probe", Probe).rank.call().get()
    print("OK", flush=True)
    os._exit(0)  # no atexit: as a controller that crashes


def scenario_tls(addresses: list) -> None:
    """Attach, spawn, calls, allreduce and an RDMA read across hosts, all
    over mutual TLS (the test's agents and this controller have TLS)."""
    check(bool(tls_credentials()), "TEST_TLS_DIR is set")
    hosts = attach(addresses)
    procs = hosts.spawn_procs(per_host={"procs": 2})
    probes = procs.spawn("probe", Probe)
    n = 2 * len(addresses)
    check(sorted(probes.rank.call().get().values()) == list(range(n)), "call")
    check(set(probes.allreduce.call().get().values()) == {float(n * (n + 1) // 2)}, "allreduce")
    buffer = probes.slice(hosts=0, procs=0).expose.call_one().get()
    far = probes.slice(hosts=1, procs=0).read.call_one(buffer).get()
    check(far == ("socket", 1.0), f"cross-host read {far}")
    hosts.shutdown().get()
    print("OK", flush=True)


def scenario_shutdown(addresses: list) -> None:
    hosts = attach(addresses)
    hosts.spawn_procs(per_host={"procs": 2}).spawn("probe", Probe).rank.call().get()
    hosts.shutdown().get()
    print("OK", flush=True)


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1].replace('-', '_')}"](sys.argv[2:])
