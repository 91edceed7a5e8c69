"""What a trace costs (docs/observability.md, "Cost"): the same workloads with
recording off and on, alternating in one controller, on the same procs.

    PYTHONPATH=<build>/python python bench/trace/trace_cost_bench.py [--rounds 5] [--calls 2000]

Workloads: Python call_one round trips to an actor in another proc, and an
8-byte allreduce between 2 actors (each in its own proc) run in a loop inside
their endpoint. Prints every round and the medians; ratio = on / off (time
per operation; 1.0 = no cost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import castmesh
from castmesh import Actor, collectives, endpoint, this_host


class Target(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def allreduces(self, n: int) -> float:
        comm = collectives.current()
        x = np.zeros(2, dtype=np.float32)  # 8 bytes
        comm.allreduce(x)
        start = time.perf_counter()
        for _ in range(n):
            comm.allreduce(x)
        return (time.perf_counter() - start) / n


def call_one_us(mesh: "castmesh.ActorMesh[Target]", calls: int) -> float:
    one = mesh.slice(procs=0)
    for i in range(100):
        one.ping.call_one(i).get()
    start = time.perf_counter()
    for i in range(calls):
        one.ping.call_one(i).get()
    return (time.perf_counter() - start) / calls * 1e6


def allreduce_us(mesh: "castmesh.ActorMesh[Target]", n: int) -> float:
    return max(mesh.allreduces.call(n).get(timeout=300).values()) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--allreduces", type=int, default=20000)
    args = parser.parse_args()
    procs = this_host().spawn_procs(per_host={"procs": 2})
    mesh = procs.spawn("target", Target)
    results = {"call_one": {"off": [], "on": []}, "allreduce_8B": {"off": [], "on": []}}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if mode == "on":
                    castmesh.trace.start(os.path.join(folder, f"trace-{r}.json"))
                results["call_one"][mode].append(call_one_us(mesh, args.calls))
                results["allreduce_8B"][mode].append(allreduce_us(mesh, args.allreduces))
                if mode == "on":
                    summary = castmesh.trace.stop()
                    dropped = summary["dropped"]
                    print(f"round {r}: trace of {summary['records']} records, {dropped} dropped")
            print(f"round {r}: " + ", ".join(
                f"{name} off {v['off'][-1]:.2f} us on {v['on'][-1]:.2f} us" for name, v in results.items()))
    print(f"{'workload':<14} {'off us (median)':>16} {'on us (median)':>15} {'on/off':>7}  runs off | on")
    for name, v in results.items():
        off, on = statistics.median(v["off"]), statistics.median(v["on"])
        runs = " ".join(f"{x:.2f}" for x in v["off"]) + " | " + " ".join(f"{x:.2f}" for x in v["on"])
        print(f"{name:<14} {off:>16.2f} {on:>15.2f} {on / off:>7.3f}  {runs}")
    procs.stop()


if __name__ == "__main__":
    main()
