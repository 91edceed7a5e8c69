"""The bytes of a buffer-protocol object as a NumPy ``uint8`` view sharing
its memory: read by buffer specifications (buffers.py) and by datatypes'
Pack/Unpack (datatypes.py) alike, so it sits below both."""

from __future__ import annotations

from typing import Any

import numpy as np

_ndarray = np.ndarray
_u8 = np.dtype(np.uint8)


def byte_view(buf: Any, writable: bool) -> np.ndarray:
    """The bytes of a contiguous buffer-protocol object as a uint8 array sharing its memory."""
    if isinstance(buf, _ndarray):
        arr = buf
    elif isinstance(buf, (list, tuple, dict, str, int, float)) or buf is None:
        raise TypeError(f"message: expected a buffer (an object with the buffer protocol), got {type(buf).__name__}")
    else:
        try:
            return _check_writable(np.frombuffer(buf, dtype=_u8), writable, buf)
        except (ValueError, BufferError, TypeError):
            arr = np.asarray(memoryview(buf))
    if arr.flags.c_contiguous:
        u8 = arr.reshape(-1).view(_u8)
    elif arr.flags.f_contiguous:
        u8 = arr.T.reshape(-1).view(_u8)
    else:
        raise BufferError("message: buffer is not contiguous")
    return _check_writable(u8, writable, buf)


def _check_writable(u8: np.ndarray, writable: bool, buf: Any) -> np.ndarray:
    if writable and not u8.flags.writeable:
        raise BufferError(f"message: the receive buffer ({type(buf).__name__}) is read-only")
    return u8
