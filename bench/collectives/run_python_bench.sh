#!/usr/bin/env bash
# What Python adds to a small allreduce: castmesh's C++ program and Open MPI's
# C program (castmesh_collectives_bench, mpi_collectives_bench: their
# allreduce row of the size) beside python_allreduce_bench.py over
# castmesh.collectives.world() and over mpi4py (Open MPI), all four under the
# same mpirun, alternating, for each rank count. Prints, per rank count, the
# four figures (medians over the rounds) and each Python figure's excess over
# its library's C/C++ call.
#
# usage: bench/collectives/run_python_bench.sh [BUILD_DIR] [--ranks="2"] [--rounds=3] [--bytes=1024] [--quick]
#   BUILD_DIR  a build with CASTMESH_BUILD_BENCHMARKS=ON and CASTMESH_BUILD_PYTHON=ON in which CMake found MPI
#              (default: build/release); its Python package (BUILD_DIR/python) is what castmesh runs
# PYTHON in the environment: the interpreter with numpy and mpi4py (default: python3). MPIRUN_ARGS adds mpirun
# flags to all four programs.
set -euo pipefail

build_dir=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build_dir=$1
  shift
fi
ranks="2"
rounds=3
bytes=1024
quick=()
for arg in "$@"; do
  case $arg in
    --ranks=*) ranks=${arg#--ranks=} ;;
    --rounds=*) rounds=${arg#--rounds=} ;;
    --bytes=*) bytes=${arg#--bytes=} ;;
    --quick) quick=(--quick) ;;
    *) echo "error: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --rounds wants a positive count, not '$rounds'" >&2
  exit 2
fi
# The C++ / C programs measure the sizes 8 B x 4^k; the Python figure must be of one of them.
case $bytes in 8 | 32 | 128 | 512 | 64 | 256 | 1024 | 4096 | 16384 | 65536) ;; *)
  echo "error: --bytes=$bytes is not a size the C++ program measures (64, 256, 1024, 4096, 16384, 65536)" >&2
  exit 2 ;;
esac
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
castmesh_bin=$build_dir/bench/collectives/castmesh_collectives_bench
mpi_bin=$build_dir/bench/collectives/mpi_collectives_bench
if ! command -v mpirun >/dev/null || ! mpirun --version 2>/dev/null | grep -q 'Open MPI'; then
  echo "error: this script runs Open MPI's mpirun; install it with: apt-get install openmpi-bin libopenmpi-dev" >&2
  exit 1
fi
for bin in "$castmesh_bin" "$mpi_bin"; do
  if [[ ! -x $bin ]]; then
    echo "error: $bin not built (configure with -DCASTMESH_BUILD_BENCHMARKS=ON where CMake finds MPI)" >&2
    exit 1
  fi
done
if [[ ! -d $build_dir/python/castmesh ]]; then
  echo "error: $build_dir/python/castmesh missing: configure with -DCASTMESH_BUILD_PYTHON=ON and build castmesh_python" >&2
  exit 1
fi
if ! "$python" -c 'import numpy, mpi4py' 2>/dev/null; then
  echo "error: $python cannot import numpy and mpi4py (pip install numpy mpi4py; PYTHON=... picks another)" >&2
  exit 1
fi

read -r -a extra_mpirun_args <<< "${MPIRUN_ARGS:-}"
mpirun_args=(--allow-run-as-root --oversubscribe --bind-to none "${extra_mpirun_args[@]}")
pypath=$(cd "$build_dir/python" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "Python allreduce overhead: castmesh vs mpi4py, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "build: $build_dir; $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mpirun: $(mpirun --version 2>/dev/null | head -1); flags: ${mpirun_args[*]} -n N"
echo "mpi4py: $("$python" -c 'import mpi4py; from mpi4py import MPI; print(mpi4py.__version__, "over", MPI.Get_library_version().rstrip(chr(0)).splitlines()[0])')"
echo "float32 sum, in place in Python (out of place in the C/C++ programs), ${bytes} B; median over $rounds rounds"

for n in $ranks; do
  for ((round = 1; round <= rounds; ++round)); do
    mpirun "${mpirun_args[@]}" -n "$n" "$castmesh_bin" --tsv --ops=allreduce --max-bytes="$bytes" "${quick[@]}" \
      | awk -F'\t' -v b="$bytes" '$1 == "row" && $2 == "allreduce" && $3 == b { print $4 }' >>"$work/cpp.$n"
    mpirun "${mpirun_args[@]}" -n "$n" "$mpi_bin" --tsv --ops=allreduce --max-bytes="$bytes" "${quick[@]}" \
      | awk -F'\t' -v b="$bytes" '$1 == "row" && $2 == "allreduce" && $3 == b { print $4 }' >>"$work/c.$n"
    mpirun "${mpirun_args[@]}" -x PYTHONPATH="$pypath" -n "$n" "$python" "$here/python_allreduce_bench.py" \
      --lib=castmesh --bytes="$bytes" "${quick[@]}" 2>/dev/null | awk -F'\t' '{ print $3 }' >>"$work/pycm.$n"
    mpirun "${mpirun_args[@]}" -n "$n" "$python" "$here/python_allreduce_bench.py" \
      --lib=mpi4py --bytes="$bytes" "${quick[@]}" 2>/dev/null | awk -F'\t' '{ print $3 }' >>"$work/pympi.$n"
  done
  for f in cpp c pycm pympi; do
    if [[ $(wc -l <"$work/$f.$n") -ne $rounds ]]; then
      echo "error: a $f run at -n $n printed no figure" >&2
      exit 1
    fi
  done
  median() { sort -g "$1" | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
  cpp=$(median "$work/cpp.$n"); c=$(median "$work/c.$n")
  pycm=$(median "$work/pycm.$n"); pympi=$(median "$work/pympi.$n")
  echo
  echo "=============== $n ranks"
  printf '%-10s | %12s %12s %14s\n' "library" "C/C++ us" "Python us" "Python adds us"
  printf '%-10s | %12.2f %12.2f %14.2f\n' castmesh "$cpp" "$pycm" "$(awk -v a="$pycm" -v b="$cpp" 'BEGIN { print a - b }')"
  printf '%-10s | %12.2f %12.2f %14.2f\n' "Open MPI" "$c" "$pympi" "$(awk -v a="$pympi" -v b="$c" 'BEGIN { print a - b }')"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
