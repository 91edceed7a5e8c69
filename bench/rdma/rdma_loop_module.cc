// castmesh_rdma_loop: the C++ half of `rdma_python_bench.py --interleave`.
//
// Python's overhead over the C++ call cannot be read off two programs run one
// after the other on this kind of machine: the host moves the kernel's
// cross-process copy between a fast and a slow mode from one half second to
// the next (bench/RESULTS.md, issue 13), so whichever program ran in the slow
// mode more often looks slower. This module times castmesh's C++
// read_into/write_from on the very handle and memory the Python loop uses,
// in the same process and thread, so the benchmark can alternate short
// batches of the two and compare each batch with its neighbour.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "castmesh/rdma.h"
#include "castmesh/tensor.h"

namespace py = pybind11;

namespace {

// Best (lowest) seconds of `reps` C++ calls of read_into (or write_from when
// `write`) of the buffer `handle` (RdmaBuffer::serialize bytes) against the
// `size` bytes at `address`, which the caller keeps alive. Runs without the GIL.
double best_of(const py::bytes& handle, uintptr_t address, size_t size, int reps, bool write) {
  absl::StatusOr<castmesh::RdmaBuffer> buffer = castmesh::RdmaBuffer::deserialize(std::string(handle));
  if (!buffer.ok()) throw py::value_error(std::string(buffer.status().message()));
  castmesh::TensorView local = castmesh::TensorView::Contiguous(
      reinterpret_cast<void*>(address), castmesh::DType::kUInt8, {static_cast<int64_t>(size)});
  absl::Status failed;
  double best = 1e30;
  {
    py::gil_scoped_release release;
    for (int i = 0; i < reps && failed.ok(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      auto done = write ? buffer->write_from(local).get() : buffer->read_into(local).get();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      failed = done.status();
    }
  }
  if (!failed.ok()) throw std::runtime_error(failed.ToString());
  return best;
}

}  // namespace

PYBIND11_MODULE(castmesh_rdma_loop, m) {
  m.doc() = "C++ read_into/write_from timing loops for rdma_python_bench.py --interleave";
  m.def("best_of", &best_of, py::arg("handle"), py::arg("address"), py::arg("size"), py::arg("reps"),
        py::arg("write"));
}
