"""Arrays for the data plane: ``castmesh.Tensor`` and the functions that make one.

A ``castmesh.Tensor`` is a view of numeric memory (castmesh::TensorView): it
either owns castmesh-allocated memory or shares another library's memory,
zero-copy, through DLPack or the buffer protocol. It is itself a DLPack
producer, so ``numpy.from_dlpack(t)`` (or torch's, CuPy's, JAX's) shares its
memory too. NumPy is never imported here. See docs/tensors.md.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

from . import _castmesh
from ._castmesh import Tensor

ShapeLike = Union[int, Sequence[int]]

__all__ = ["Tensor", "from_dlpack", "empty", "zeros"]


def from_dlpack(obj: Any, stream: Any = None) -> Tensor:
    """A zero-copy ``castmesh.Tensor`` of ``obj``.

    ``obj`` is anything with ``__dlpack__`` (NumPy, PyTorch, CuPy, JAX arrays,
    another ``castmesh.Tensor``) or the buffer protocol (``bytearray``,
    ``array.array``, ``memoryview``); host arrays offering both are taken
    through the buffer protocol, the cheaper of the two. The result keeps
    ``obj`` alive and is read-only when ``obj`` is.

    For a CUDA/ROCm array castmesh follows the DLPack stream protocol: it calls
    ``obj.__dlpack__(stream=<handle>)`` naming ``stream`` (a
    ``castmesh.tensor_engine.Stream``, the one you will use the tensor on;
    default: castmesh's own consume stream of that device), so the producer
    orders its pending work before anything enqueued there.
    """
    return _castmesh.as_tensor(obj, False, stream)


def _shape(shape: ShapeLike) -> list:
    if isinstance(shape, int):
        return [shape]
    return [int(size) for size in shape]


def _dtype_name(dtype: Any) -> str:
    """``"float32"``, ``numpy.float32`` and ``numpy.dtype("float32")`` all name float32."""
    if isinstance(dtype, str):
        return dtype
    for attribute in ("name", "__name__"):
        name = getattr(dtype, attribute, None)
        if isinstance(name, str):
            return name
    raise TypeError(f"cannot read a castmesh dtype from {dtype!r}; pass a name such as 'float32'")


def zeros(shape: ShapeLike, dtype: Any = "float32") -> Tensor:
    """A new zero-filled, 64-byte aligned, C-contiguous CPU tensor owned by castmesh."""
    return _castmesh.allocate_tensor(_shape(shape), _dtype_name(dtype))


def empty(shape: ShapeLike, dtype: Any = "float32") -> Tensor:
    """A new CPU tensor whose contents are unspecified (castmesh currently zero-fills it)."""
    return zeros(shape, dtype)
