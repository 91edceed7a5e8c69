"""RDMA buffers from Python: castmesh.rdma vs torchmonarch's monarch.rdma,
the same program.

A "trainer" actor in a worker proc registers a buffer of each size; the
controller reads it into local memory (read_into) and writes local memory
into it (write_from). Best of N per size; GB/s = 1e9 bytes/s.

    python bench/rdma/rdma_python_bench.py                       # castmesh
    python bench/rdma/rdma_python_bench.py --framework monarch   # needs torchmonarch (and torch)

bench/rdma/run_rdma_bench.sh runs the C++ benchmark, this one with
castmesh and this one with monarch (in its own venv) in one sitting.

    python bench/rdma/rdma_python_bench.py --interleave=40       # Python against C++

--interleave=N measures what the Python API adds over the C++ call: N rounds
per size, each a best-of batch through castmesh.rdma and one through the C++
loop of the castmesh_rdma_loop module (BUILD/bench/rdma on PYTHONPATH), same
handle, same memory, same thread, in alternating order; it prints the median
of the rounds' Python/C++ time ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import time

# rdma_bench's buffers are plain 4 KiB pages (aligned_alloc, no madvise), but
# NumPy asks for transparent huge pages (MADV_HUGEPAGE) on arrays of 4 MiB and
# more: at 64 MiB the Python figures then copied between 2 MiB pages (seen in
# AnonHugePages of both procs) and C++ between 4 KiB ones. Off here, before
# NumPy is imported, and inherited by the worker proc, so that both programs
# time the same memory.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def reps_for(size: int, quick: bool) -> int:
    """rdma_bench's repetitions (best of N there too), so that both figures are
    the same statistic."""
    if quick:
        return 2
    return 2000 if size <= 4096 else 100 if size <= 1 << 20 else 8 if size <= 64 << 20 else 3


def best(reps: int, fn) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def aligned_bytes(n: int, fill: int):
    """n uint8 at a 64-byte aligned address, like rdma_bench's TensorView::Allocate
    buffers, so that both benchmarks time the same transfer: the kernel's
    cross-process copy ran 10-25% slower at 1 MiB when source and destination
    differ in alignment modulo 64 (bench/RESULTS.md), and where np.zeros lands
    depends on malloc's history."""
    import numpy as np

    raw = np.empty(n + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    data = raw[start:start + n]
    data[:] = fill
    return data


def castmesh_trainer():
    """(procs, trainer): a worker proc whose Trainer actor's make(n) registers n
    bytes of 7s and returns the RdmaBuffer."""
    from castmesh import Actor, endpoint, this_host
    from castmesh.rdma import RdmaBuffer

    class Trainer(Actor):
        def __init__(self):
            self.keep = []

        @endpoint
        def make(self, n: int):
            data = aligned_bytes(n, 7)
            self.keep.append(data)
            return RdmaBuffer(data)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    trainer = procs.spawn("trainer", Trainer)
    return procs, trainer


def run_castmesh(sizes, quick):
    procs, trainer = castmesh_trainer()
    out = {}
    for size in sizes:
        buf = trainer.make.call_one(size).get()
        local = aligned_bytes(size, 0)
        reps = reps_for(size, quick)
        read = best(reps, lambda: buf.read_into(local).get())
        assert local[-1] == 7
        write = best(reps, lambda: buf.write_from(local).get())
        out[size] = (read, write)
        buf.release().get()
    procs.stop().get()
    return out


def run_interleaved(sizes, quick, rounds):
    """{size: [(python_read_s, cpp_read_s, python_write_s, cpp_write_s) per round]}."""
    import castmesh_rdma_loop

    procs, trainer = castmesh_trainer()
    out = {}
    for size in sizes:
        buf = trainer.make.call_one(size).get()
        handle = bytes(buf._handle.serialize())
        local = aligned_bytes(size, 0)
        reps = reps_for(size, quick)
        python = {False: lambda: buf.read_into(local).get(), True: lambda: buf.write_from(local).get()}

        def timed(write: bool, cpp: bool) -> float:
            if cpp:
                return castmesh_rdma_loop.best_of(handle, local.ctypes.data, size, reps, write)
            return best(reps, python[write])

        out[size] = []
        for i in range(rounds):
            row = []
            for write in (False, True):
                cpp_first = i % 2 == 1  # neither side always runs right after the other kind of batch
                first = timed(write, cpp_first)
                second = timed(write, not cpp_first)
                row += [second, first] if cpp_first else [first, second]
            out[size].append(tuple(row))
        assert local[-1] == 7
        buf.release().get()
    procs.stop().get()
    return out


def print_interleaved(results) -> None:
    import statistics

    print("castmesh: Python API against the C++ call, alternating best-of batches in one process")
    print(f"{'size':>10} {'rounds':>6} {'C++ read':>9} {'Py read':>9} {'read +%':>17} "
          f"{'C++ write':>9} {'Py write':>9} {'write +%':>17}")
    for size, rows in results.items():
        cells = []
        for py_col, cpp_col in ((0, 1), (2, 3)):
            cpp = statistics.median(size / r[cpp_col] / 1e9 for r in rows)
            python = statistics.median(size / r[py_col] / 1e9 for r in rows)
            over = sorted(100 * (r[py_col] / r[cpp_col] - 1) for r in rows)
            spread = f"{statistics.median(over):+.1f} ({over[0]:+.0f}..{over[-1]:+.0f})"
            cells.append(f"{cpp:>9.2f} {python:>9.2f} {spread:>17}")
        print(f"{size:>10} {len(rows):>6} {cells[0]} {cells[1]}")
    print("GB/s are medians of the rounds' best-of batches; +% is the median (range) of Python's time over C++'s "
          "in the same round")


def run_monarch(sizes, quick):
    import torch
    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMABuffer

    class Trainer(Actor):
        def __init__(self):
            self.keep = []

        @endpoint
        def make(self, n: int) -> RDMABuffer:
            data = torch.full((n,), 7, dtype=torch.uint8)
            self.keep.append(data)
            return RDMABuffer(data)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    trainer = procs.spawn("trainer", Trainer)
    out = {}
    for size in sizes:
        buf = trainer.make.call_one(size).get()
        local = torch.zeros(size, dtype=torch.uint8)
        reps = reps_for(size, quick)
        read = best(reps, lambda: buf.read_into(local, timeout=120).get())
        assert int(local[-1]) == 7
        write = best(reps, lambda: buf.write_from(local, timeout=120).get())
        out[size] = (read, write)
        buf.drop().get()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["castmesh", "monarch"], default="castmesh")
    parser.add_argument("--sizes", default="4K,1M,64M")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON line {size: [read_s, write_s]}")
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="castmesh only: Python against the C++ call, ROUNDS alternating rounds per size")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.interleave:
        if args.framework != "castmesh":
            parser.error("--interleave measures castmesh's Python API against its C++ call")
        print_interleaved(run_interleaved(sizes, args.quick, args.interleave))
        return
    run = run_castmesh if args.framework == "castmesh" else run_monarch
    results = run(sizes, args.quick)
    if args.json:
        print(json.dumps({str(k): v for k, v in results.items()}))
        return
    print(f"{args.framework}: RDMA buffer between two procs, best of N")
    print(f"{'size':>10} {'read GB/s':>10} {'write GB/s':>11} {'read us':>9}")
    for size, (read, write) in results.items():
        print(f"{size:>10} {size / read / 1e9:>10.3f} {size / write / 1e9:>11.3f} {read * 1e6:>9.1f}")


if __name__ == "__main__":
    main()
