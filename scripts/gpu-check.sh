#!/usr/bin/env bash
# The tensor_engine backend on a real GPU, in one command (a few minutes):
#   bash scripts/gpu-check.sh
# Builds the CUDA backend, the core, the Python module and castmesh_te_bench
# (Release, in build/gpu-check or $CASTMESH_GPU_CHECK_BUILD), then runs the
# real path and prints figures:
#   1. castmesh_te_bench: allreduce, broadcast and allgather through the
#      Communicator on a non-default stream with results checked (one rank
#      per GPU), then device<->host copy bandwidth and allreduce latency/bus
#      bandwidth against the same backend calls made directly;
#   2. Python: castmesh.tensor_engine devices, memory and copies, and DLPack
#      round trips with PyTorch and CuPy on CUDA when they are installed,
#      with the stream protocol both ways on side streams (no host
#      synchronisation between producer and consumer; results checked).
# NCCL comes from pip's nvidia-nccl-cu13/-cu12 (found on sys.path) or the
# system loader path. On a machine without an NVIDIA GPU it says so and
# exits 0.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${CASTMESH_GPU_CHECK_BUILD:-${ROOT}/build/gpu-check}
PYTHON=${PYTHON:-python3}
JOBS=${CASTMESH_JOBS:-$(nproc)}

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): nothing to check, exiting 0"
  exit 0
fi
nvidia-smi -L
CUDA_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
[ -d "${CUDA_ROOT}" ] || { echo "gpu-check: no CUDA toolkit at ${CUDA_ROOT}; set CUDAToolkit_ROOT"; exit 1; }

launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
pybind=()
if "${PYTHON}" -m pybind11 --cmakedir > /dev/null 2>&1; then
  pybind=(-DCASTMESH_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "${PYTHON}")"
          -Dpybind11_DIR="$("${PYTHON}" -m pybind11 --cmakedir)")
else
  echo "gpu-check: pybind11 not importable by ${PYTHON}: the Python checks are skipped (pip install pybind11)"
  pybind=(-DCASTMESH_BUILD_PYTHON=OFF)
fi
mkdir -p "${BUILD}"
cmake -S "${ROOT}" -B "${BUILD}" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCASTMESH_WITH_TENSOR_ENGINE=cuda -DCUDAToolkit_ROOT="${CUDA_ROOT}" -DCASTMESH_WITH_RDMA=OFF \
  -DCASTMESH_BUILD_BENCHMARKS=ON -DCASTMESH_BUILD_TESTS=OFF -DCASTMESH_BUILD_EXAMPLES=OFF "${pybind[@]}" \
  > "${BUILD}.configure.log" 2>&1 || { cat "${BUILD}.configure.log"; exit 1; }
targets=(castmesh_tensor_engine castmesh_te_bench)
[ "${pybind[0]}" = "-DCASTMESH_BUILD_PYTHON=ON" ] && targets+=(castmesh_python castmesh_python_sources)
cmake --build "${BUILD}" -j"${JOBS}" --target "${targets[@]}"

export CASTMESH_BACKEND_PATH=${BUILD}/lib/castmesh/backends
# NCCL from a pip wheel: put its lib folder on the loader path.
nccl_lib=$("${PYTHON}" - << 'PY' 2>/dev/null || true
import glob, os, sys
for p in sys.path:
    hits = glob.glob(os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so.2"))
    if hits:
        print(os.path.dirname(hits[0]))
        break
PY
)
[ -n "${nccl_lib}" ] && export LD_LIBRARY_PATH=${nccl_lib}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
echo "gpu-check: NCCL from ${nccl_lib:-the system loader path}"

echo "== castmesh_te_bench (results checked, then figures)"
"${BUILD}/bench/tensor_engine/castmesh_te_bench" --iters=20 --max-mib=64

if [ "${pybind[0]}" = "-DCASTMESH_BUILD_PYTHON=ON" ]; then
  echo "== Python: castmesh.tensor_engine and DLPack round trips"
  PYTHONPATH=${BUILD}/python "${PYTHON}" - << 'PY'
import array, time
import castmesh
from castmesh import tensor_engine as te

print("devices:", [(d["index"], d["name"]) for d in te.devices()])
s = te.Stream("cuda:0")
n = 1 << 24
x = te.empty((n,), "float32", "cuda:0")
host = castmesh.zeros((n,), "float32")
t0 = time.perf_counter(); te.copy(x, host, s); s.synchronize(); h2d = time.perf_counter() - t0
t0 = time.perf_counter(); te.copy(host, x, s); s.synchronize(); d2h = time.perf_counter() - t0
print(f"pageable copies of {n * 4 >> 20} MiB: H2D {n * 4 / h2d / 1e9:.2f} GB/s, D2H {n * 4 / d2h / 1e9:.2f} GB/s")
small = te.empty((3,), "int32", "cuda:0")
te.copy(small, array.array("i", [1, 2, 3]), s)
back = castmesh.zeros((3,), "int32"); te.copy(back, small, s); s.synchronize()
assert back.tolist() == [1, 2, 3], back.tolist()
# The DLPack stream protocol both ways, on side streams without host
# synchronisation in between: castmesh names its stream to the producer
# (torch/cupy order their pending kernels before it), and torch/cupy name
# theirs to castmesh (castmesh's pending copy is ordered before it).
big = 1 << 24
pending = te.empty((big,), "float32", "cuda:0")
te_work = te.Stream("cuda:0")
try:
    import torch
    if torch.cuda.is_available():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.full((big,), 3.0, device="cuda", dtype=torch.float32)
            for _ in range(20):
                t.mul_(1.0).add_(0.0)                       # keep the side stream busy
            t.mul_(2.0)
        cs = te.Stream("cuda:0")
        c = castmesh.from_dlpack(t, stream=cs)              # side's work is ordered before cs
        assert c.data_ptr == t.data_ptr(), "castmesh view of a torch tensor is not zero-copy"
        host = castmesh.zeros((big,), "float32")
        te.copy(host, c, cs); cs.synchronize()
        got = memoryview(host).cast("B").cast("f")
        assert got[0] == 6.0 and got[big - 1] == 6.0, (got[0], got[big - 1])
        wrapped = te.Stream.from_native("cuda:0", side.cuda_stream)   # torch's stream as a castmesh Stream
        assert wrapped.native_handle == side.cuda_stream
        # castmesh -> torch: a large pending copy on castmesh's stream, then
        # torch consumes on its own current stream (which must wait for it).
        src = castmesh.zeros((big,), "float32")
        memoryview(src).cast("B").cast("f")[big - 1] = 5.0
        te.copy(pending, src, te_work)
        u = torch.from_dlpack(pending)                       # __dlpack__(stream=torch's current stream)
        assert u.device.type == "cuda" and float(u[big - 1].item()) == 5.0
        u2 = torch.from_dlpack(small)
        assert u2.cpu().tolist() == [1, 2, 3]
        print("torch DLPack round trip with the stream protocol: ok (side stream)")
except ImportError:
    print("torch not installed: its round trip skipped")
try:
    import cupy
    with cupy.cuda.Stream(non_blocking=True) as cside:
        a = cupy.full((big,), 4, dtype=cupy.int32)
        a *= 2
    cs = te.Stream("cuda:0")
    c = castmesh.from_dlpack(a, stream=cs)
    assert c.data_ptr == a.data.ptr
    host = castmesh.zeros((big,), "int32")
    te.copy(host, c, cs); cs.synchronize()
    got = memoryview(host).cast("B").cast("i")
    assert got[0] == 8 and got[big - 1] == 8, (got[0], got[big - 1])
    src = castmesh.zeros((big,), "float32")
    memoryview(src).cast("B").cast("f")[0] = 7.0
    te.copy(pending, src, te_work)
    b = cupy.from_dlpack(pending)                            # cupy names its current stream
    assert float(b[0].get()) == 7.0
    assert cupy.from_dlpack(small).get().tolist() == [1, 2, 3]
    print("cupy DLPack round trip with the stream protocol: ok (side stream)")
except ImportError:
    print("cupy not installed: its round trip skipped")
print("gpu-check python: ok")
PY
fi
echo "gpu-check: done"
