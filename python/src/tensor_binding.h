// Python objects <-> castmesh::TensorView, for every binding that takes or
// returns array data (castmesh.Tensor, castmesh.from_dlpack, collectives).
// Call these with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include "castmesh/tensor.h"
#include "castmesh/tensor_engine.h"

namespace castmesh::python {

// A zero-copy view of `obj`: a castmesh.Tensor's own view; otherwise through
// __dlpack__ (asked with max_version=(1, 0), then the legacy call when the
// producer raises TypeError), otherwise the buffer protocol (also taken when
// a legacy producer refuses a read-only array with BufferError). The view's
// owner holds a reference to `obj` (and the DLPack tensor or Py_buffer);
// dropping the last copy on a thread without the GIL never waits for it:
// a releaser thread of the binding lets go of the object later. Raises BufferError when `writable` and `obj` is
// read-only, ValueError/BufferError/TypeError for unusable objects.
castmesh::TensorView tensor_from_python(pybind11::handle obj, bool writable);
// The same for data castmesh will use on a device stream (the DLPack stream
// protocol): a CUDA/ROCm producer (not a castmesh.Tensor) is asked with
// __dlpack__(stream=<native handle of *stream>), so its pending work is
// ordered before castmesh's; when *stream is no stream, castmesh's consume
// stream of the producer's device is used and stored into *stream.
castmesh::TensorView tensor_from_python(pybind11::handle obj, bool writable, castmesh::DeviceStream* stream);

// A castmesh.Tensor wrapping `view`: a DLPack producer (__dlpack__,
// __dlpack_device__) with the buffer protocol, shape, dtype, strides, nbytes,
// tolist() and __repr__.
pybind11::object tensor_to_python(castmesh::TensorView view);

}  // namespace castmesh::python
