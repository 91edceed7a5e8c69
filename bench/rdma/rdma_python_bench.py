"""RDMA buffers from Python: castmesh.rdma vs torchmonarch's monarch.rdma,
the same program.

A "trainer" actor in a worker proc registers a buffer of each size; the
controller reads it into local memory (read_into) and writes local memory
into it (write_from). Best of N per size; GB/s = 1e9 bytes/s.

    python bench/rdma/rdma_python_bench.py                       # castmesh
    python bench/rdma/rdma_python_bench.py --framework monarch   # needs torchmonarch (and torch)

bench/rdma/run_rdma_bench.sh runs the C++ benchmark, this one with
castmesh and this one with monarch (in its own venv) in one sitting.
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


def run_castmesh(sizes, quick):
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
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
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
