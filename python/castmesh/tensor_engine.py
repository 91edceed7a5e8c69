"""Device memory, streams and copies through the tensor_engine backend (CUDA or ROCm).

::

    from castmesh import tensor_engine as te
    te.devices()                                   # [{'kind': 'cuda', 'index': 0, 'name': ..., ...}]
    s = te.Stream("cuda:0")
    x = te.empty((1024,), "float32", "cuda:0")     # a castmesh.Tensor of device memory (DLPack kDLCUDA)
    te.copy(x, numpy_array, s)                     # host -> device, in the order of `s`
    te.copy(numpy_array, x, s); s.synchronize()    # device -> host

``castmesh.collectives`` calls take such tensors (or any DLPack device
array) and run NCCL/RCCL through the backend. Without the backend (not
installed, no driver, no GPU) every call raises RuntimeError saying how to
install it: ``pip install "castmesh[tensor-engine]"`` (and, for device
collectives, ``pip install nvidia-nccl-cu13``). See docs/tensors.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from . import _castmesh
from .tensor import Tensor

__all__ = ["Event", "Stream", "copy", "devices", "empty"]

Stream = _castmesh.DeviceStream
"""A stream of the backend: ``Stream("cuda:0")``, ``.synchronize()``, ``.query()``, ``.device``,
``.native_handle`` (the cudaStream_t/hipStream_t as an integer); ``Stream.from_native("cuda:0", handle)`` wraps
a framework's stream (e.g. ``torch.cuda.current_stream().cuda_stream``) without owning it."""

Event = _castmesh.DeviceEvent
"""An event: ``Event("cuda:0")``, ``.record(stream)``, ``.query()``, ``.synchronize()``, ``.wait(stream)``."""


def devices() -> List[Dict[str, Any]]:
    """The backend's devices: dicts of kind, index, name, memory_bytes, detail."""
    return list(_castmesh.te_devices())


def empty(shape: Sequence[int], dtype: str = "float32", device: str = "cuda:0") -> Tensor:
    """Uninitialised device memory of ``shape`` and ``dtype`` on ``device`` ('cuda:N' or 'rocm:N').

    The memory is freed when the tensor (and every DLPack export of it) is gone.
    """
    return _castmesh.te_empty([int(s) for s in shape], dtype, device)


def copy(dst: Any, src: Any, stream: Stream) -> None:
    """Copies ``src`` into ``dst`` (host<->device or within a device) in the order of ``stream``.

    A host ``dst`` holds the data once ``stream.synchronize()`` returned.
    """
    _castmesh.te_copy(dst, src, stream)
