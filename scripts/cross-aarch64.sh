#!/usr/bin/env bash
# Cross-compiles the castmesh core for aarch64 (every backend OFF, no Python)
# and runs the core's unit tests (ctest label "core") under qemu-aarch64, so
# the lock-free code (shared-memory rings, cross-process futexes, the
# scheduler) runs on a weakly ordered CPU model.
# Installs what it needs on Debian 12: crossbuild-essential-arm64, qemu-user
# and the arm64 builds of the core's libraries (multiarch).
#
#   bash scripts/cross-aarch64.sh           # build + qemu ctest (CI's aarch64 stage)
#   bash scripts/cross-aarch64.sh --probe   # prints what this machine has; installs nothing
#                                           # (exit 0: can run; 2: cannot)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${CASTMESH_JOBS:-2}
BUILD_DIR=${CASTMESH_CROSS_BUILD_DIR:-build/aarch64}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PACKAGES=(crossbuild-essential-arm64 qemu-user
  libabsl-dev:arm64 libprotobuf-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64 libssl-dev:arm64)

# Whether the kernel hands aarch64 programs to qemu by itself (binfmt_misc):
# only then can a test exec another aarch64 program. Prints "registered
# (<entry>)" or why not.
binfmt_state() {
  local entry
  for entry in /proc/sys/fs/binfmt_misc/qemu-aarch64 /proc/sys/fs/binfmt_misc/qemu-aarch64-static; do
    if [ -r "${entry}" ] && head -1 "${entry}" | grep -qx enabled; then echo "registered (${entry##*/})"; return; fi
  done
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then echo "not mounted"; else echo "no enabled qemu-aarch64 entry"; fi
}

if [ "${1:-}" = --probe ]; then
  binfmt=$(binfmt_state)
  qemu="qemu-aarch64 not installed yet"
  command -v qemu-aarch64 > /dev/null && qemu=$(qemu-aarch64 --version | head -1)
  missing=$(bash scripts/install-deps.sh --list-missing "${PACKAGES[@]}" 2> /dev/null) \
    || { echo "cannot list the arm64 packages (is this Debian with dpkg?)"; exit 2; }
  if [ -n "${missing}" ] && ! command -v apt-get > /dev/null; then echo "missing ${missing} and no apt-get"; exit 2; fi
  echo "${qemu}; binfmt_misc: ${binfmt}; packages to install: ${missing:-none}"
  exit 0
fi

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "castmesh: enabling the arm64 multiarch architecture"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
bash scripts/install-deps.sh "${PACKAGES[@]}"

launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "${BUILD_DIR}" -G Ninja "${launcher[@]}" \
  -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DCASTMESH_WERROR=ON \
  -DCASTMESH_WITH_RDMA=OFF -DCASTMESH_WITH_TENSOR_ENGINE=OFF -DCASTMESH_BUILD_PYTHON=OFF \
  -DCASTMESH_BUILD_TESTS=ON -DCASTMESH_BUILD_EXAMPLES=OFF -DCASTMESH_BUILD_BENCHMARKS=OFF
cmake --build "${BUILD_DIR}" -j"${JOBS}"
file "${BUILD_DIR}/lib/libcastmesh_core.so."*.*.* | head -1

# What cannot run under qemu-user, each decided and said why. qemu-user runs
# one aarch64 program in an x86-64 process: the kernel cannot exec another
# aarch64 program (without binfmt_misc), and /proc/self/exe, as the kernel
# resolves it for exec and stat, is the emulator, not the test program.
#
# 1. Suites that start worker procs: the worker is this test binary again,
#    started through /proc/self/exe (castmesh::platform::executable_path, the
#    WORKER_PROCS harness, world_test's and rendezvous_test's posix_spawn),
#    which under qemu-user re-executes the emulator with the test's arguments
#    (binfmt_misc does not change that). Excluded always. The cross-process
#    primitives they rely on run here in single-process, multi-threaded form
#    on two mappings of one shared-memory object, as two procs would:
#    ShmRing.OneProducerOneSleepingConsumerOnTwoMappingsLoseNothing and
#    ShmRing.ManyProducers... (the rings and their doorbell),
#    FutexShared.PingPongThroughTwoMappings... and Futex.* (cross-process and
#    private futexes), the scheduler and mailbox suites (the lock-free queues).
#    The one-sided RDMA tables need process_vm_readv between two procs and
#    stay untested on aarch64.
WORKER_PROCS='^(ProcMesh|ProcActorMesh|ProcCastTree|RemoteMonitor|LocalAllocator|RendezvousAllocator|ProcCommunicator|ShmPath|World|PipelinedAllreduceProcs|DeviceCollectivesAcrossProcsFake|RdmaDeviceMissingBackendFake|StackService|ShortHandlers|Metrics)\.|^Transports/RdmaAcrossProcs\.|^Transports/RdmaDeviceAcrossProcsFake\.'
# 2. Process.ExecutablePathIsThisProgram stats /proc/self/exe, which qemu-user
#    does not redirect (it does for readlink and open): the emulator. Always.
# 3. HostMesh.* exec the aarch64 castmesh-host agent, which starts its procs
#    like case 1. Always.
# 5. The stack-dump captures that need a signal handled when it arrives:
#    qemu-user runs a guest thread's signal handler only when the thread next
#    leaves translated code or its host system call, so a thread in a busy
#    loop or parked in the kernel is neither held nor captured in time (the
#    same as under ThreadSanitizer; the capture itself runs here in
#    NativeStacks.AParkedThreadAnswers...). Always.
SIGNAL_TIMING='^NativeStacks\.(AThreadSilentInOneCaptureAnswersTheNextOnce|WhileStoppedRunsWithTheAnsweredThreadsHeld)$'
ALWAYS="${WORKER_PROCS}|^Process\.ExecutablePathIsThisProgram$|^HostMesh\.|${SIGNAL_TIMING}"
# 4. Log.LoggingDuringStaticDestructionIsSafe starts a separate aarch64 probe
#    program, and TensorViewDeathTest's "threadsafe" death tests exec the test
#    binary by its argv[0] path (not /proc/self/exe): both run where
#    binfmt_misc hands aarch64 programs to qemu, else "Exec format error".
NEEDS_BINFMT='^TensorViewDeathTest\.|^Log\.LoggingDuringStaticDestructionIsSafe$'
# (FakeDeviceMeshTest.HostBuffersOnOneRankOnceTheDeviceCommunicatorExistsFailEveryRank
# was excluded after it hung once in two runs under qemu: a scheduler lost
# wake-up, found under valgrind and fixed; it runs here again.)
binfmt=$(binfmt_state)
if [[ "${binfmt}" == registered* ]]; then
  EXCLUDE="${ALWAYS}"
  echo "castmesh: binfmt_misc ${binfmt}: the tests that exec aarch64 programs run (${NEEDS_BINFMT})"
else
  EXCLUDE="${ALWAYS}|${NEEDS_BINFMT}"
  echo "castmesh: NOTE: binfmt_misc ${binfmt}: not run under qemu-aarch64 (they exec aarch64 programs): ${NEEDS_BINFMT}"
fi
echo "castmesh: NOTE: not run under qemu-aarch64 (they re-execute /proc/self/exe): ${ALWAYS}"
ctest --test-dir "${BUILD_DIR}" -L core -E "${EXCLUDE}" -j"${JOBS}" --output-on-failure --timeout 600
