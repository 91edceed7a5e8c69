"""Output forwarding throughput: lines/s from procs to the controller's
stdout (end to end: written in the procs, captured at fd 1, sent, printed
with a prefix; the procs' stop, which waits for the last lines, included), beside the same lines written to a local file by one process.

    PYTHONPATH=build/release/python python bench/output/bench_output.py [--procs 4] [--lines 200000] > /dev/null

(The figures go to stderr; stdout is the forwarded lines.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import castmesh
from castmesh import Actor, endpoint


class Writer(Actor):
    @endpoint
    def write(self, n: int) -> int:
        out = sys.stdout
        line = "x" * 60
        for i in range(n):
            out.write(f"{i:08d} {line}\n")
        out.flush()
        return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--lines", type=int, default=200_000, help="per proc")
    args = parser.parse_args()
    total = args.procs * args.lines
    with tempfile.TemporaryFile("w") as f:
        t = time.perf_counter()
        line = "x" * 60
        for i in range(total):
            f.write(f"{i:08d} {line}\n")
        f.flush()
        os.fsync(f.fileno())
        local = total / (time.perf_counter() - t)
    procs = castmesh.this_host().spawn_procs({"procs": args.procs})
    procs.logging_option(stream_to_client=True).get()
    writers = procs.spawn("writer", Writer)
    t = time.perf_counter()
    writers.write.call(args.lines).get()
    procs.stop().get()  # a stopping proc sends what it holds and waits until it arrived
    castmesh._castmesh.flush_forwarded_output()  # ... and every line is printed
    forwarded = total / (time.perf_counter() - t)
    print(f"{total} lines of 70 B from {args.procs} procs: forwarded to the controller {forwarded:,.0f} lines/s; "
          f"one process writing them to a local file {local:,.0f} lines/s ({forwarded / local:.2f}x)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
