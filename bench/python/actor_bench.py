"""Python actor benchmark: castmesh vs ray vs torchmonarch, same program.

Two figures per framework, each with actors in other procs (4 worker procs):
  * call_one: sequential request/response round trips with a small argument
    to one actor (``ping(i) -> i``), in calls per second;
  * broadcast+call: ``incr.broadcast(1)`` then ``get.call()`` over the 4-actor
    mesh (one iteration = 4 one-way messages + 4 requests + 4 replies), in
    iterations per second.

A floor is measured in the same run (``--framework floor``, and first in
``--all``): a Python program that pickles a small call tuple, sends it over
a Unix socketpair to a child process, which unpickles it, pickles the answer
and sends it back (``floor_round_trips_per_s``): the least any cross-process
Python call costs on this machine. ``--all`` prints castmesh's call_one rate
over that floor (issue 37's target: at least 0.5).

Usage:
  python actor_bench.py --framework castmesh            # one framework
  python actor_bench.py --all --ray-python /tmp/venv-ray/bin/python \\
      --monarch-python /tmp/venv-monarch/bin/python     # side by side
Each framework runs in its own interpreter (its own venv); results are
printed as a table and as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def bench_monarch_api(api, calls: int, rounds: int) -> dict:
    """Runs the figures through a Monarch-style API module: castmesh and
    monarch.actor share it (porting is one changed import), so one body
    measures both."""

    class Echo(api.Actor):
        def __init__(self) -> None:
            self.value = 0

        @api.endpoint
        def ping(self, x: int) -> int:
            return x

        @api.endpoint
        def incr(self, by: int) -> None:
            self.value += by

        @api.endpoint
        def get(self) -> int:
            return self.value

    procs = api.this_host().spawn_procs(per_host={"gpus": 4})
    try:
        mesh = procs.spawn("echo", Echo)
        one = mesh.slice(gpus=1)
        for i in range(200):
            one.ping.call_one(i).get()
        start = time.perf_counter()
        for i in range(calls):
            one.ping.call_one(i).get()
        call_one = calls / (time.perf_counter() - start)
        for _ in range(20):
            mesh.incr.broadcast(1)
            mesh.get.call().get()
        start = time.perf_counter()
        for _ in range(rounds):
            mesh.incr.broadcast(1)
            mesh.get.call().get()
        bcast = rounds / (time.perf_counter() - start)
    finally:
        procs.stop().get()
    return {"call_one_per_s": call_one, "broadcast_call_per_s": bcast}


def _floor_child(sock) -> None:
    """The floor's answering side: unpickle a call, pickle its answer."""
    import pickle

    while True:
        header = _recv_exact(sock, 4)
        if not header:
            return
        (args, kwargs) = pickle.loads(_recv_exact(sock, int.from_bytes(header, "little")))
        reply = pickle.dumps((True, args[0]))
        sock.sendall(len(reply).to_bytes(4, "little") + reply)


def _recv_exact(sock, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return b""
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def bench_floor(calls: int, rounds: int) -> dict:
    """Python pickle + Unix socketpair round trips between two processes
    (length-prefixed frames, the same ``ping(i) -> i`` shape as call_one)."""
    import pickle
    import socket

    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            _floor_child(child)
        finally:
            os._exit(0)
    child.close()

    def round_trip(i: int) -> int:
        call = pickle.dumps(((i,), {}))
        parent.sendall(len(call).to_bytes(4, "little") + call)
        header = _recv_exact(parent, 4)
        ok, value = pickle.loads(_recv_exact(parent, int.from_bytes(header, "little")))
        return value

    try:
        for i in range(200):
            round_trip(i)
        start = time.perf_counter()
        for i in range(calls):
            assert round_trip(i) == i
        rate = calls / (time.perf_counter() - start)
    finally:
        parent.close()
        os.waitpid(pid, 0)
    return {"floor_round_trips_per_s": rate}


def bench_castmesh(calls: int, rounds: int) -> dict:
    import castmesh

    return bench_monarch_api(castmesh, calls, rounds)


def bench_ray(calls: int, rounds: int) -> dict:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

    @ray.remote
    class Echo:
        def __init__(self) -> None:
            self.value = 0

        def ping(self, x: int) -> int:
            return x

        def incr(self, by: int) -> None:
            self.value += by

        def get(self) -> int:
            return self.value

    actors = [Echo.remote() for _ in range(4)]
    ray.get([a.get.remote() for a in actors])
    one = actors[1]
    for i in range(200):
        ray.get(one.ping.remote(i))
    start = time.perf_counter()
    for i in range(calls):
        ray.get(one.ping.remote(i))
    call_one = calls / (time.perf_counter() - start)
    for _ in range(20):
        for a in actors:
            a.incr.remote(1)
        ray.get([a.get.remote() for a in actors])
    start = time.perf_counter()
    for _ in range(rounds):
        for a in actors:
            a.incr.remote(1)
        ray.get([a.get.remote() for a in actors])
    bcast = rounds / (time.perf_counter() - start)
    ray.shutdown()
    return {"call_one_per_s": call_one, "broadcast_call_per_s": bcast}


def bench_monarch(calls: int, rounds: int) -> dict:
    import monarch.actor

    return bench_monarch_api(monarch.actor, calls, rounds)


BENCHES = {"floor": bench_floor, "castmesh": bench_castmesh, "ray": bench_ray, "monarch": bench_monarch}


def run_all(args: argparse.Namespace) -> int:
    pythons = {"floor": sys.executable, "castmesh": sys.executable, "ray": args.ray_python, "monarch": args.monarch_python}
    results = {}
    for name, python in pythons.items():
        if not python:
            results[name] = {"error": "not run (no interpreter given)"}
            continue
        cmd = [python, os.path.abspath(__file__), "--framework", name, "--calls", str(args.calls),
               "--rounds", str(args.rounds)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"timed out after {args.timeout} s"}
            continue
        line = next((l for l in reversed(out.stdout.splitlines()) if l.startswith("{")), None)
        if out.returncode != 0 or line is None:
            tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
            results[name] = {"error": f"exit {out.returncode}: " + " | ".join(tail)}
        else:
            results[name] = json.loads(line)
    print(f"{'framework':<10} {'call_one calls/s':>18} {'broadcast+call iter/s':>22}")
    floor = results.pop("floor")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<10} {r['error']}")
        else:
            print(f"{name:<10} {r['call_one_per_s']:>18.0f} {r['broadcast_call_per_s']:>22.0f}")
    others = [r["call_one_per_s"] for n, r in results.items() if n != "castmesh" and "error" not in r]
    if others and "error" not in results["castmesh"]:
        print(f"castmesh call_one / fastest other: {results['castmesh']['call_one_per_s'] / max(others):.2f}x")
    if "error" in floor:
        print(f"floor (pickle+socketpair): {floor['error']}")
    else:
        print(f"floor (pickle+socketpair round trips/s): {floor['floor_round_trips_per_s']:.0f}")
        if "error" not in results["castmesh"]:
            ratio = results["castmesh"]["call_one_per_s"] / floor["floor_round_trips_per_s"]
            print(f"castmesh call_one / floor: {ratio:.2f}x (target >= 0.5)")
    for name, r in {"floor": floor, **results}.items():
        print(json.dumps({"framework": name, **r}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=sorted(BENCHES))
    parser.add_argument("--all", action="store_true", help="run every framework, each in its interpreter")
    parser.add_argument("--ray-python", default="")
    parser.add_argument("--monarch-python", default="")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if args.all:
        return run_all(args)
    if not args.framework:
        parser.error("give --framework or --all")
    result = BENCHES[args.framework](args.calls, args.rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
