"""SPMD frameworks inside actors: the torch.distributed bridge.

``setup_torch_elastic_env(procs)`` sets, in every proc of ``procs``, the
variables torchrun would (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so
``torch.distributed.init_process_group()`` works unchanged in the actors
spawned there afterwards (Monarch's ``monarch.spmd`` names). Ranks follow the
mesh's row-major order; a "group" is a host: the procs sharing the host part
of their address, in order of first appearance.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import TYPE_CHECKING, Dict, List, Optional

from .actor import current_rank
from .future import Future, in_thread

if TYPE_CHECKING:
    from .proc_mesh import ProcMesh

__all__ = ["setup_torch_elastic_env", "setup_torch_elastic_env_async"]


def _host_of(proc_id: str) -> str:
    """The host part of a proc address; procs on Unix addresses are this host."""
    if proc_id.startswith("tcp:"):
        return proc_id[4:].rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1"


def _free_port() -> int:
    """A port free on this host now (run in rank 0's proc)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _apply(table: Dict[int, Dict[str, str]]) -> None:
    """Sets this proc's variables (its rank is its position in the mesh)."""
    os.environ.update(table[current_rank().rank])


def torch_elastic_env(proc_ids: List[str], master_addr: str, master_port: int) -> Dict[int, Dict[str, str]]:
    """The variables of each proc, by row-major position."""
    hosts: Dict[str, List[int]] = {}
    for position, proc_id in enumerate(proc_ids):
        hosts.setdefault(_host_of(proc_id), []).append(position)
    table: Dict[int, Dict[str, str]] = {}
    for group, positions in enumerate(hosts.values()):
        for local, position in enumerate(positions):
            table[position] = {
                "RANK": str(position), "WORLD_SIZE": str(len(proc_ids)),
                "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(len(positions)),
                "GROUP_RANK": str(group), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            }
    return table


def setup_torch_elastic_env_async(proc_mesh: "ProcMesh", master_addr: Optional[str] = None,
                                  master_port: Optional[int] = None) -> Future[None]:
    """:func:`setup_torch_elastic_env` as a Future (``await`` or ``.get()``)."""

    def setup() -> None:
        proc_ids = proc_mesh.proc_ids
        first = proc_mesh.slice(**{label: 0 for label in proc_mesh.shape.labels}) if proc_mesh.shape.labels \
            else proc_mesh
        addr = master_addr or _host_of(proc_ids[0])
        port = master_port or next(iter(first._run_in_every_proc(_free_port, "free_port").values()))
        proc_mesh._run_in_every_proc(functools.partial(_apply, torch_elastic_env(proc_ids, addr, port)),
                                     "torch_elastic_env")

    return in_thread(setup, "castmesh-torch-env")


def setup_torch_elastic_env(proc_mesh: "ProcMesh", master_addr: Optional[str] = None,
                            master_port: Optional[int] = None) -> None:
    """Sets torchrun's variables in every proc of ``proc_mesh`` (MASTER_ADDR
    defaults to rank 0's host, MASTER_PORT to a port free there now)."""
    setup_torch_elastic_env_async(proc_mesh, master_addr, master_port).get()
