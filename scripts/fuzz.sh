#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/) with clang + ASan/UBSan and runs
# each for a bounded time, starting from the seed corpus in tests/fuzz/corpus/.
# The clang build of the core is also CI's lock check: -Werror=thread-safety
# turns every ABSL_GUARDED_BY the analysis finds broken into an error
# (docs/architecture.md, Locks).
# Any crash, sanitizer report, leak or timeout fails the script (exit != 0);
# the input that caused it is left in build/fuzz-artifacts/.
#
#   bash scripts/fuzz.sh                      # 600 s per harness (by hand)
#   CASTMESH_FUZZ_SECONDS=30 bash scripts/fuzz.sh   # what CI runs (scripts/test.sh)
#   bash scripts/fuzz.sh fuzz_wire_frames     # only the named harnesses
#
# CASTMESH_FUZZ_BUILD: the build folder (default build/fuzz).
# The corpus grown by a run is kept in build/fuzz-corpus/<harness>/ (not in
# the repository); each harness prints its executions and coverage at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER=${CASTMESH_FUZZ_SECONDS:-600}
JOBS=${CASTMESH_JOBS:-2}
BUILD=${CASTMESH_FUZZ_BUILD:-${ROOT}/build/fuzz}
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(fuzz_wire_frames fuzz_proc_endpoint)

command -v clang++ > /dev/null || { echo "castmesh: scripts/fuzz.sh needs clang (apt-get install clang libclang-rt-14-dev)"; exit 1; }
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# lld where installed (CI installs it): links the sanitised core several times faster than GNU ld.
command -v ld.lld > /dev/null && launcher+=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
cmake -S . -B "${BUILD}" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCASTMESH_SANITIZE=address,undefined \
  -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -fsized-deallocation -Werror=thread-safety" \
  -DCASTMESH_BUILD_FUZZERS=ON -DCASTMESH_BUILD_TESTS=OFF -DCASTMESH_BUILD_PYTHON=OFF -DCASTMESH_BUILD_EXAMPLES=OFF \
  -DCASTMESH_WITH_RDMA=OFF -DCASTMESH_WITH_TENSOR_ENGINE=OFF > "${BUILD}.configure.log" 2>&1 \
  || { cat "${BUILD}.configure.log"; exit 1; }
cmake --build "${BUILD}" -j"${JOBS}" --target "${HARNESSES[@]}"

mkdir -p "${ROOT}/build/fuzz-artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export CASTMESH_LOG=${CASTMESH_LOG:-error}  # the harnesses provoke warnings by the thousand
for harness in "${HARNESSES[@]}"; do
  corpus=${ROOT}/build/fuzz-corpus/${harness}
  mkdir -p "${corpus}"
  echo "=== ${harness}: ${SECONDS_PER}s"
  # -timeout: an input that takes longer is a hang (fails the run).
  "${BUILD}/tests/fuzz/${harness}" "${corpus}" "${ROOT}/tests/fuzz/corpus/${harness}" \
    -max_total_time="${SECONDS_PER}" -timeout=10 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="${ROOT}/build/fuzz-artifacts/${harness}-" 2>&1 \
    | grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' || { echo "castmesh: ${harness} FAILED (input in build/fuzz-artifacts/)"; exit 1; }
done
