"""Times comm.allreduce on a small NumPy array from Python, castmesh or mpi4py.

Run under mpirun, one process per rank:

    mpirun -n 2 python bench/collectives/python_allreduce_bench.py --lib=castmesh
    mpirun -n 2 python bench/collectives/python_allreduce_bench.py --lib=mpi4py

The measurement mirrors castmesh_collectives_bench's (collective_suite.cc), so
the two figures compare with the C++ / C programs' allreduce row of the same
size: warm-up calls, then samples of `calls` back-to-back in-place float32 sum
allreduces, each sample starting after a barrier; per sample the slowest rank,
then the median. Every call's result is checked once at the end (the ranks'
values summed). Rank 0 prints one line: "<lib>\t<bytes>\t<us per call>".
bench/collectives/run_python_bench.sh runs all four programs side by side.
"""

import argparse
import statistics
import sys
import time

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=["castmesh", "mpi4py"], required=True)
    parser.add_argument("--bytes", type=int, default=1024, help="message size (a multiple of 4)")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100, help="allreduces per sample")
    parser.add_argument("--quick", action="store_true", help="3 samples of 5 calls (a smoke run)")
    args = parser.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        parser.error(f"--bytes={args.bytes} is not a positive multiple of 4 (float32)")
    if args.quick:
        args.samples, args.calls = 3, 5

    if args.lib == "castmesh":
        import castmesh.collectives

        comm = castmesh.collectives.world()
        rank, size = comm.rank, comm.size

        def allreduce(x):
            comm.allreduce(x)  # in place

        def slowest(x):
            comm.allreduce(x, op="max")

        barrier = comm.barrier
        version = "castmesh " + getattr(castmesh, "__version__", "?")
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()

        def allreduce(x):
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

        def slowest(x):
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)

        barrier = comm.Barrier
        version = f"mpi4py {__import__('mpi4py').__version__} over {MPI.Get_library_version().rstrip(chr(0)).splitlines()[0]}"

    x = np.ones(args.bytes // 4, dtype=np.float32)
    for _ in range(max(args.calls, 2)):  # warm-up: links up, pages touched
        allreduce(x)
    x[:] = 1
    mine = []
    done = max(args.calls, 2)
    for _ in range(args.samples):
        barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            allreduce(x)
        mine.append((time.perf_counter() - start) * 1e6 / args.calls)
        done += args.calls
    # Every element went through `samples * calls` allreduces from 1: size**n.
    # Checked as a float (it overflows to inf past float32's range; then only
    # that it is inf everywhere).
    expected = np.float32(1)
    with np.errstate(over="ignore"):
        for _ in range(args.samples * args.calls):
            expected = np.float32(expected * size)
    if not np.all(x == expected):
        print(f"rank {rank}: wrong result {x[:4]} (expected {expected})", file=sys.stderr)
        return 1
    per_sample = np.array(mine, dtype=np.float64)
    slowest(per_sample)
    if rank == 0:
        print(f"# {version}, {size} ranks", file=sys.stderr)
        print(f"{args.lib}\t{args.bytes}\t{statistics.median(per_sample.tolist()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
