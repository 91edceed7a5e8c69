"""The settings of castmesh's data plane and transport, with Monarch's names.

One table (docs/config.md) holds every setting with its default; the process's
``CASTMESH_*`` environment variables override the defaults, and the runtime layer
set here overrides both::

    import castmesh.config as config

    config.configure(shm_spin_us=50)            # this process, and procs spawned from now on
    with config.configured(rdma_fallback="error"):
        ...                                     # the runtime layer is restored on exit
    config.get_global_config()["shm_spin_us"]   # 50

Procs the controller spawns afterwards (``this_host().spawn_procs``, HostMesh
procs) get the runtime layer in their environment. Settings docs/config.md marks
"once" are read at their first use in a process: configure them before the
process moves data (later changes reach new procs only).

An unknown name or a malformed value raises ``ValueError`` and changes nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _castmesh

__all__ = ["configure", "configured", "get_global_config", "get_runtime_config", "clear_runtime_config"]

# key -> kind ("bool", "int", "choice", "str"), from the C++ table.
_KINDS: Dict[str, str] = {row[0]: row[2] for row in _castmesh.config_settings()}


def _to_text(key: str, value: Any) -> str:
    kind = _KINDS.get(key)
    if kind is None:
        return str(value)  # the table refuses it, naming the nearest known setting (ValueError)
    if isinstance(value, bool):
        if kind in ("bool", "choice"):
            return "1" if value else "0"
        raise TypeError(f"castmesh setting {key!r} takes {_describe(kind)}, not a bool")
    if isinstance(value, int) and kind in ("int", "bool", "choice"):
        return str(value)
    if isinstance(value, str) and kind in ("choice", "str", "bool"):
        return value
    raise TypeError(f"castmesh setting {key!r} takes {_describe(kind)}, not {type(value).__name__}")


def _describe(kind: Optional[str]) -> str:
    return {"bool": "a bool", "int": "an int", "choice": "one of its choices (str)"}.get(kind or "", "a str")


def _from_text(key: str, text: str) -> Any:
    kind = _KINDS[key]
    if kind == "bool":
        return text == "1"
    if kind == "int":
        return int(text) if text else None
    return text


def _pairs(values: Dict[str, Any]) -> List[Tuple[str, str]]:
    return [(key, _to_text(key, value)) for key, value in values.items()]


def configure(**values: Any) -> None:
    """Sets settings in the runtime layer (keys as in docs/config.md, e.g. ``shm_spin_us=50``).

    All or nothing: ``ValueError`` for an unknown key or a value out of range,
    ``TypeError`` for a value of the wrong type.
    """
    _castmesh.config_configure(_pairs(values))


def get_runtime_config() -> Dict[str, Any]:
    """The runtime layer: the settings set with configure, by key."""
    return {key: _from_text(key, text) for key, text in _castmesh.config_runtime()}


def clear_runtime_config() -> None:
    """Empties the runtime layer (the environment and the defaults apply again)."""
    _castmesh.config_clear_runtime()


def get_global_config() -> Dict[str, Any]:
    """Every setting's value now (defaults, environment, runtime layer merged), by key.

    ``ValueError`` when the environment holds an unknown ``CASTMESH_`` variable or
    a malformed value (docs/config.md).
    """
    return {key: _from_text(key, text) for key, text in _castmesh.config_global()}


@contextmanager
def configured(**values: Any) -> Iterator[Dict[str, Any]]:
    """Applies ``values`` to the runtime layer for the ``with`` block, yielding the merged settings.

    On exit the runtime layer is what it was before (including on an exception).
    """
    saved = _castmesh.config_runtime()
    configure(**values)
    try:
        yield get_global_config()
    finally:
        _castmesh.config_set_runtime(saved)
