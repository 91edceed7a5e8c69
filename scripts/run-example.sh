#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs castmesh's main example end to end,
# then the Python quick start (examples/python/quickstart.py) against the core
# wheel built here and installed into the venv build/venv-example.
#
# The example to run is one CMake target built in the dev tree; to switch to
# another example, change EXAMPLE_TARGET and EXAMPLE_ARGS (or set
# CASTMESH_EXAMPLE_TARGET in the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${CASTMESH_JOBS:-2}
EXAMPLE_TARGET=${CASTMESH_EXAMPLE_TARGET:-castmesh_list_backends}
EXAMPLE_ARGS=()

bash scripts/install-deps.sh
cmake --preset dev
# The example plus every backend this machine can build, which the core
# discovers at run time in build/dev/lib/castmesh/backends.
cmake --build --preset dev -j"${JOBS}" --target "${EXAMPLE_TARGET}" castmesh_backends
example=$(find build/dev/examples -type f -name "${EXAMPLE_TARGET}" -perm -u+x | head -n 1)
[ -n "${example}" ] || { echo "example ${EXAMPLE_TARGET} was not built" >&2; exit 1; }
echo "=== running ${example} ${EXAMPLE_ARGS[*]}"
"${example}" "${EXAMPLE_ARGS[@]}"

# The data plane (examples/collectives/): an MPI-style SPMD program on the
# Communicator, 4 processes started the way mpirun would start them.
if [ -z "${CASTMESH_EXAMPLE_TARGET:-}" ]; then
  cmake --build --preset dev -j"${JOBS}" --target castmesh_spmd_allreduce
  echo "=== running examples/collectives/run_spmd.sh build/dev/examples/collectives/castmesh_spmd_allreduce 4"
  sh examples/collectives/run_spmd.sh build/dev/examples/collectives/castmesh_spmd_allreduce 4
fi

# The single-controller model (examples/mesh/): 8 worker procs as a 2x4 mesh,
# one actor each; cast, slices, call -> ValueMesh, reductions, a failing
# member, a killed proc.
if [ -z "${CASTMESH_EXAMPLE_TARGET:-}" ]; then
  cmake --build --preset dev -j"${JOBS}" --target castmesh_mesh_example
  echo "=== running build/dev/examples/mesh/castmesh_mesh_example"
  build/dev/examples/mesh/castmesh_mesh_example
fi

# The same from Python: the core wheel (build/dist-example; its CMake tree is
# kept in build/wheel-core for the next run) installed into build/venv-example,
# then actors and an allreduce across 4 procs. Use that venv afterwards
# (build/venv-example/bin/python), or pip install the wheel elsewhere.
if [ -z "${CASTMESH_EXAMPLE_TARGET:-}" ]; then
  source scripts/python-wheel.sh
  castmesh_tools_venv build/venv-tools
  rm -rf build/dist-example
  launcher=()
  command -v ccache > /dev/null && launcher=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CMAKE_BUILD_PARALLEL_LEVEL=${JOBS} castmesh_build_wheel build/venv-tools/bin/python build/dist-example . \
    -Cbuild-dir=build/wheel-core "${launcher[@]}"
  castmesh_wheel_venv build/venv-tools/bin/python build/venv-example build/dist-example castmesh
  echo "=== running build/venv-example/bin/python examples/python/quickstart.py"
  build/venv-example/bin/python examples/python/quickstart.py
fi
