"""mpi4py's OSU demos under castmesh.MPI and under real mpi4py (Open MPI), side by side (issue 36).

    python bench/mpi4py/osu_side_by_side.py [--ranks 2] [--cache DIR] [demo ...]

Fetches the mpi4py 4.1.2 sdist (pip download, cached in DIR), runs each demo
with ``mpirun -n RANKS`` twice, once as shipped and once with
``from castmesh import MPI``, and prints per message size both figures and
castmesh/mpi4py (latency: lower is better; osu_bw/bibw print MB/s: higher
is better). The interpreter running this must import both castmesh and
mpi4py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Dict

VERSION = "4.1.2"
DEMOS = ["osu_latency", "osu_bw", "osu_bcast", "osu_allgather", "osu_barrier", "osu_alltoall", "osu_gather",
         "osu_scatter"]


def demo_folder(cache: Path, work: Path) -> Path:
    sdist = cache / f"mpi4py-{VERSION}.tar.gz"
    if not sdist.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"mpi4py=={VERSION}", "-d", str(cache)], check=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, members=[m for m in tar.getmembers() if f"mpi4py-{VERSION}/demo/osu_" in m.name])
    return work / f"mpi4py-{VERSION}" / "demo"


def run(script: Path, ranks: int) -> Dict[str, float]:
    proc = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(ranks), sys.executable,
                           str(script)], capture_output=True, text=True, check=True, timeout=600)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.strip() and not line.startswith("#"):
            size, value = line.split()
            rows[size] = float(value)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demos", nargs="*", default=DEMOS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "castmesh-mpi4py-sdist")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = demo_folder(args.cache, Path(tmp))
        for name in args.demos:
            original = folder / f"{name}.py"
            rewritten = Path(tmp) / f"{name}_castmesh.py"
            rewritten.write_text(original.read_text().replace("from mpi4py import MPI", "from castmesh import MPI"))
            theirs = run(original, args.ranks)
            ours = run(rewritten, args.ranks)
            unit = "MB/s" if name in ("osu_bw", "osu_bibw") else "us"
            print(f"## {name} ({args.ranks} ranks, {unit})")
            print(f"{'size':>10} {'castmesh':>12} {'mpi4py':>12} {'ratio':>7}")
            for size, value in theirs.items():
                mine = ours.get(size, float("nan"))
                ratio = mine / value if value else float("nan")
                print(f"{size:>10} {mine:12.2f} {value:12.2f} {ratio:7.2f}")
            print(flush=True)


if __name__ == "__main__":
    shutil.which("mpirun") or sys.exit("mpirun not found")
    main()
