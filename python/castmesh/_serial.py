"""How castmesh pickles Python messages: stdlib pickle for plain data,
cloudpickle for anything else (classes defined in ``__main__``, closures,
lambdas), so both the hot path and user-defined types work."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

_PLAIN = (int, float, str, bytes, bool, type(None), complex)
_PLAIN_TYPES = frozenset(_PLAIN)  # exact types: one set look-up instead of isinstance's walk


def _is_plain(value: Any, depth: int = 0) -> bool:
    if type(value) in _PLAIN_TYPES or isinstance(value, _PLAIN):
        return True
    if depth > 2:
        return False
    if type(value) in (tuple, list):
        return all(_is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _is_flat(value: Any) -> bool:
    """The common cases, checked without recursion: a reply ``("ok",
    scalar)`` and a call's ``((scalars...), {})``."""
    if type(value) is not tuple or len(value) != 2:
        return False
    first, second = value
    if type(second) in _PLAIN_TYPES:
        return type(first) in _PLAIN_TYPES
    return (type(first) is tuple and type(second) is dict and not second
            and all(type(v) in _PLAIN_TYPES for v in first))


def dumps(value: Any) -> bytes:
    """Pickles ``value`` (stdlib pickle when it is plain data, else cloudpickle)."""
    if _is_flat(value) or _is_plain(value):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


loads = pickle.loads
