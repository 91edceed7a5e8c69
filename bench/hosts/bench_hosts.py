"""Cross-host costs on simulated machines (network namespaces on one box,
tests/testing/netns_hosts.py; needs root):

- a raw TCP round trip (8 bytes, Python sockets) between this controller's
  namespace and a host, next to castmesh's Python call_one to an actor on
  that host, and broadcast+call over every host;
- spawn_procs latency for HOSTS x PER_HOST procs;
- the heartbeat's cost on an idle attached host: bytes per second on the
  host's link and the agent's CPU time.

    sudo PYTHONPATH=build/release/python python bench/hosts/bench_hosts.py [--hosts 3] [--per-host 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))

import netns_hosts  # noqa: E402

import castmesh  # noqa: E402
from castmesh import Actor, endpoint  # noqa: E402

SECRET = "bench-hosts-secret"
PORT = 26600
ECHO = ("import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 26700));"
        " s.listen(1); print('up', flush=True)\n"
        "c,_=s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        "while True:\n    d=c.recv(64)\n    if not d: break\n    c.sendall(d)\n")


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def best_of(samples: list) -> str:
    return f"median {statistics.median(samples):8.1f} us  (min {min(samples):.1f})"


def raw_tcp_us(hosts: "netns_hosts.NetnsHosts", rounds: int) -> list:
    server = hosts.popen(1, [sys.executable, "-c", ECHO, hosts.address(1)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().startswith("up")
    s = socket.create_connection((hosts.address(1), 26700))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        s.sendall(b"12345678")
        s.recv(64)
        out.append((time.perf_counter() - t) * 1e6)
    s.close()
    server.wait(timeout=10)
    return out


def link_bytes(name: str) -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        if line.strip().startswith(name + ":"):
            fields = line.split(":", 1)[1].split()
            return int(fields[0]) + int(fields[8])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    if netns_hosts.skip_reason():
        sys.exit(f"bench_hosts needs network namespaces: {netns_hosts.skip_reason()}")
    os.environ["CASTMESH_SECRET"] = SECRET
    with netns_hosts.NetnsHosts(n=args.hosts) as hosts:
        agents = []
        for k in hosts.hosts():
            agent = hosts.popen(k, [sys.executable, "-m", "castmesh.host", "--address",
                                    f"tcp://{hosts.address(k)}:{PORT}"], env=dict(os.environ),
                                stdout=subprocess.PIPE, stderr=open(f"/tmp/bench-agent{k}.log", "w"), text=True)
            assert agent.stdout is not None and "listening" in agent.stdout.readline()
            agents.append(agent)
        print(f"{args.hosts} hosts (network namespaces), controller in the root namespace")
        print(f"raw TCP round trip (Python sockets, 8 B):       {best_of(raw_tcp_us(hosts, args.rounds))}")
        mesh = castmesh.attach_to_workers(workers=[f"tcp://{hosts.address(k)}:{PORT}" for k in hosts.hosts()])
        mesh.initialized.get()
        t = time.perf_counter()
        procs = mesh.spawn_procs(per_host={"procs": args.per_host})
        print(f"spawn_procs {args.hosts} hosts x {args.per_host} procs:            "
              f"{(time.perf_counter() - t) * 1e3:8.1f} ms")
        echo = procs.spawn("echo", Echo)
        one = echo.slice(hosts=0, procs=0)
        for _ in range(200):
            one.ping.call_one(1).get()
        samples = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            one.ping.call_one(1).get()
            samples.append((time.perf_counter() - t) * 1e6)
        print(f"castmesh Python call_one to host 1:             {best_of(samples)}")
        samples = []
        for _ in range(max(50, args.rounds // 10)):
            t = time.perf_counter()
            echo.ping.broadcast(1)
            echo.ping.call(1).get()
            samples.append((time.perf_counter() - t) * 1e6)
        print(f"broadcast+call over {len(echo)} procs on {args.hosts} hosts:       {best_of(samples)}")
        # Idle heartbeats: the host's link bytes and the agent's CPU over 5 s.
        link = f"{hosts.name(1).rsplit('-', 1)[0]}-v1"
        b0, c0 = link_bytes(link), cpu_seconds(agents[0].pid)
        time.sleep(5.0)
        b1, c1 = link_bytes(link), cpu_seconds(agents[0].pid)
        conns = 1 + args.per_host  # the host's agent and procs, each with one connection to the controller
        print(f"idle heartbeat, host 1 ({conns} connections to the controller): {(b1 - b0) / 5.0:8.0f} B/s on its link, "
              f"agent CPU {(c1 - c0) / 5.0 * 100:.2f}% of a core")
        mesh.shutdown().get()
        for agent in agents:
            agent.wait(timeout=30)


if __name__ == "__main__":
    main()
