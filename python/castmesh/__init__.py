"""castmesh: an actor runtime with pluggable accelerator and network backends.

The core (libcastmesh_core) runs anywhere; backends such as ``rdma`` and
``tensor_engine`` are separate plugin packages (``pip install "castmesh[rdma]"``
from castmesh's built wheels, README "Python")
found at run time. ``castmesh.backends()`` says which were found and, for each
one that is not usable, why and how to fix it.
"""

from __future__ import annotations

import os
import warnings
from importlib import metadata
from typing import List

try:
    from . import _castmesh
except ImportError as _error:  # e.g. PYTHONPATH=python: the source tree has no compiled extension
    if _error.name not in (f"{__name__}._castmesh", __name__):
        raise
    raise ImportError(
        f"castmesh's compiled extension (castmesh._castmesh) is not next to {os.path.dirname(__file__)}: "
        "this looks like castmesh's source tree. Install castmesh (bash scripts/run-example.sh builds the "
        "wheel into build/dist-example and a venv build/venv-example that has it; or pip install . from "
        "the source tree), or build it with cmake --preset dev -DCASTMESH_BUILD_PYTHON=ON && cmake --build "
        "--preset dev and use PYTHONPATH=build/dev/python") from _error
from ._castmesh import BackendInfo, DeviceInfo
from . import config  # the settings table (docs/config.md): castmesh.config.configure(...)
from . import debug  # stack dumps of procs (docs/observability.md): castmesh.debug.stacks(mesh)

__version__: str = _castmesh.__version__

# Actors and meshes (docs/python.md).
from .actor import Actor, concurrent_endpoint, current_rank, current_size, endpoint
from .errors import ActorError, ActorFailedError, CastmeshError, ProcError, SupervisionError
from .future import Future
from .actor_mesh import Accumulator, ActorMesh, Endpoint, EndpointRef, ResultStream, as_endpoint
from .proc_mesh import ProcMesh, Rendezvous, rendezvous_proc_mesh, this_proc
# Many hosts, one controller (docs/hosts.md).
from .host_mesh import HostMesh, ProcCommand, attach_to_workers, run_worker_loop_forever, this_host
from . import mesh  # castmesh.mesh: the names it has always had
from .instance import Context, Instance, context, current_actor_name, get_or_spawn_controller
from .ports import Channel, Port, PortReceiver, send
from .shape import Extent, Point, Shape, ValueMesh
from .supervision import MeshFailure, unhandled_fault_hook
# Traces and user spans (docs/observability.md).
from . import trace
from .trace import span, traced
# Built-in metrics and user meters (docs/observability.md).
from .meters import get_meter, metrics, observer_target
# Arrays for the data plane (docs/tensors.md).
from .tensor import Tensor, empty, from_dlpack, zeros

__all__ = [
    "__version__", "BackendInfo", "DeviceInfo", "backends", "load_backend", "cmake_dir",
    "Actor", "endpoint", "concurrent_endpoint", "current_rank", "current_size",
    "ActorError", "ActorFailedError", "CastmeshError", "ProcError",
    "Future", "ActorMesh", "EndpointRef", "ResultStream", "HostMesh", "ProcMesh", "this_host", "this_proc",
    "Rendezvous", "rendezvous_proc_mesh", "attach_to_workers", "run_worker_loop_forever", "ProcCommand",
    "Point", "Shape", "ValueMesh",
    "SupervisionError", "MeshFailure", "unhandled_fault_hook",
    "Channel", "Port", "PortReceiver", "send",
    "Context", "Instance", "context", "current_actor_name", "get_or_spawn_controller",
    "Extent", "Endpoint", "Accumulator", "as_endpoint",
    "Tensor", "from_dlpack", "empty", "zeros",
    "trace", "span", "traced",
    "metrics", "get_meter", "observer_target",
]

_BACKEND_ENTRY_POINT_GROUP = "castmesh.backends"


def _register_plugin_packages() -> None:
    """Tells the core where installed plugin packages keep their libraries.

    Each plugin wheel declares an entry point in the group ``castmesh.backends``
    that returns its library's path. A broken plugin package gives a warning,
    never an import error: the core works without any backend.
    """
    for entry_point in metadata.entry_points(group=_BACKEND_ENTRY_POINT_GROUP):
        try:
            path = entry_point.load()()
        except Exception as error:  # noqa: BLE001 - any failure of a third-party hook
            warnings.warn(
                f"castmesh backend package {entry_point.value!r} is broken ({error}); "
                f"reinstall it with pip install --force-reinstall castmesh[{entry_point.name}]",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        _castmesh.add_backend_search_path(os.fspath(path))


def backends() -> List[BackendInfo]:
    """Every backend found, plus the well-known ones that were not, with state and message."""
    return _castmesh.backends()


def load_backend(name_or_path: str) -> BackendInfo:
    """Loads a backend by name (``"rdma"``) or library path.

    Raises RuntimeError with the reason and the fix when it is unavailable.
    """
    return _castmesh.load_backend(name_or_path)


def cmake_dir() -> str:
    """Folder holding castmeshConfig.cmake, for ``-Dcastmesh_DIR=...`` in C++ projects."""
    return os.path.join(os.path.dirname(__file__), "lib", "cmake", "castmesh")


_register_plugin_packages()


# Submodules reachable as attributes without an import of their own
# (``castmesh.collectives.current()``), loaded on first use.
_LAZY_SUBMODULES = ("MPI", "collectives", "rdma", "tensor_engine", "job", "spmd")


def __getattr__(name: str) -> object:
    """``castmesh.MPI`` (mpi4py's API, docs/mpi4py.md), ``castmesh.collectives``,
    ``castmesh.rdma``, ... are imported on first use."""
    if name in _LAZY_SUBMODULES:
        import importlib  # noqa: PLC0415 - lazy: castmesh.MPI needs NumPy
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'castmesh' has no attribute {name!r}")
