#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every castmesh test (what CI runs).
# Each stage prints its duration; a summary table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${CASTMESH_JOBS:-2}

STAGES=()
stage() {
  local name=$1; shift
  local start=$SECONDS
  echo "=== [castmesh test] ${name}"
  "$@"
  local took=$((SECONDS - start))
  STAGES+=("$(printf '%-44s %6ss' "${name}" "${took}")")
  echo "=== [castmesh test] ${name}: ${took}s"
}
summary() {
  local rc=$?
  echo "=== [castmesh test] stage timings (total ${SECONDS}s)"
  printf '    %s\n' "${STAGES[@]}"
  [ $rc -eq 0 ] || echo "=== [castmesh test] FAILED (exit ${rc})"
}
trap summary EXIT

# The CUDA toolkit is optional: compile the CUDA backend when it is there.
CUDA_ROOT=${CUDA_HOME:-/usr/local/cuda}
if [ -x "${CUDA_ROOT}/bin/nvcc" ] && [ -f "${CUDA_ROOT}/include/cuda_runtime_api.h" ]; then
  TENSOR_ENGINE=(-DCASTMESH_WITH_TENSOR_ENGINE=cuda "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  echo "castmesh: CUDA toolkit found at ${CUDA_ROOT}: the CUDA tensor_engine backend is compiled and tested"
else
  TENSOR_ENGINE=(-DCASTMESH_WITH_TENSOR_ENGINE=OFF)
  echo "castmesh: NOTE: no CUDA toolkit at ${CUDA_ROOT} (set CUDA_HOME): the CUDA tensor_engine backend is SKIPPED"
fi

dev_build() {
  cmake --preset dev -DCASTMESH_WITH_RDMA=ON "${TENSOR_ENGINE[@]}"
  cmake --build --preset dev -j"${JOBS}"
}

stage "install Debian packages" bash scripts/install-deps.sh
stage "dev build (-Werror, rdma, tensor_engine)" dev_build
stage "dev ctest" ctest --preset dev -j"${JOBS}"
