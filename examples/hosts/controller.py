"""One controller, three hosts: attaches to the host agents given on the
command line, starts two procs on each, and calls, broadcasts to and reduces
over them (docs/hosts.md). Started by examples/hosts/run.sh, or by hand:

    CASTMESH_SECRET=... python controller.py tcp://node1:26600 tcp://node2:26600 tcp://node3:26600
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

import castmesh
from castmesh import Actor, collectives, endpoint


class Worker(Actor):
    @endpoint
    def where(self) -> str:
        return f"{socket.gethostname()} pid {os.getpid()}"

    @endpoint
    def total(self) -> float:
        x = np.full(4, castmesh.current_rank().rank + 1.0)
        collectives.current().allreduce(x)  # shared memory inside a host, sockets between hosts
        return float(x[0])


def main(workers: list) -> None:
    hosts = castmesh.attach_to_workers(workers=workers, name="examples/hosts")
    hosts.initialized.get()
    print(f"attached {hosts}: {[h['hostname'] for h in hosts.hosts]}")
    procs = hosts.spawn_procs(per_host={"procs": 2})
    workers_mesh = procs.spawn("worker", Worker)
    for point, where in workers_mesh.where.call().get().items():
        print(f"  {point}: {where}")
    print("allreduce of rank + 1 over every proc:", set(workers_mesh.total.call().get().values()))
    hosts.shutdown().get()
    print("shut down: no proc and no agent left")


if __name__ == "__main__":
    main(sys.argv[1:] or sys.exit(__doc__))
