#!/usr/bin/env bash
# Runs the RDMA buffer benchmarks in one sitting and prints their tables:
#   1. bench/rdma/rdma_bench (C++): castmesh single copy, shared segment and socket paths beside
#      memcpy and a raw Unix socket stream / round trip;
#   2. bench/rdma/rdma_python_bench.py with castmesh (Python API), then its
#      --interleave mode: the Python API against the C++ call in one process;
#   3. the same Python program with torchmonarch's monarch.rdma (TCP fallback
#      without a NIC), when --monarch-python names a Python that has it.
#
# usage: bench/rdma/run_rdma_bench.sh [BUILD_DIR] [--monarch-python=PATH] [--sizes=4K,1M,64M,1G] [--quick]
#   BUILD_DIR  a Release build with benchmarks and Python (default build/release)
set -euo pipefail
build_dir=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build_dir=$1
  shift
fi
monarch_python=""
sizes="4K,1M,64M,1G"
quick=()
for arg in "$@"; do
  case $arg in
    --monarch-python=*) monarch_python=${arg#--monarch-python=} ;;
    --sizes=*) sizes=${arg#--sizes=} ;;
    --quick) quick=(--quick) ;;
    *) echo "unknown argument $arg" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

echo "== C++: rdma_bench --sizes=${sizes}"
"${build_dir}/bench/rdma/rdma_bench" --sizes="${sizes}" "${quick[@]}"
py_sizes=${sizes/,1G/}  # the Python runs stop at 64 MiB (torchmonarch over TCP takes minutes per GiB)
echo "== Python: castmesh.rdma --sizes=${py_sizes}"
PYTHONPATH="${build_dir}/python${PYTHONPATH:+:${PYTHONPATH}}" "${python}" "${here}/rdma_python_bench.py" \
  --sizes="${py_sizes}" "${quick[@]}"
echo "== Python: castmesh.rdma against the C++ call, interleaved --sizes=${py_sizes}"
PYTHONPATH="${build_dir}/python:${build_dir}/bench/rdma${PYTHONPATH:+:${PYTHONPATH}}" "${python}" \
  "${here}/rdma_python_bench.py" --sizes="${py_sizes}" --interleave=40 "${quick[@]}"
if [[ -n ${monarch_python} ]]; then
  echo "== Python: monarch.rdma (torchmonarch) --sizes=${py_sizes}"
  "${monarch_python}" "${here}/rdma_python_bench.py" --framework monarch --sizes="${py_sizes}" "${quick[@]}" 2>&1 |
    grep -v -e Warning -e RdmaXcel -e "internal logs"
fi
