"""castmesh from Python in one page: actors on a mesh of 4 worker procs,
then an allreduce among them (the data plane inside the mesh).

Run: python examples/python/quickstart.py   (castmesh installed, e.g. the venv
that scripts/run-example.sh makes: build/venv-example/bin/python)
"""
import array

import castmesh
from castmesh import Actor, current_rank, endpoint, this_host


class Worker(Actor):
    """One per proc: answers calls, and sums a vector with its peers."""

    @endpoint
    def hello(self, name: str) -> str:
        return f"rank {current_rank()['procs']} says hello to {name}"

    @endpoint
    def allreduce(self) -> list:
        comm = castmesh.collectives.current()          # the mesh's ranks, row-major
        data = array.array("d", [comm.rank + 1.0] * 4)  # any buffer-protocol or DLPack object
        comm.allreduce(data, timeout=60)                # in place, op="sum"
        return list(data)


def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 4})
    workers = procs.spawn("worker", Worker)
    for point, greeting in workers.hello.call("the controller").get().items():
        print(point, greeting)
    sums = workers.allreduce.call().get()
    expected = [1.0 + 2.0 + 3.0 + 4.0] * 4
    for point, values in sums.items():
        if values != expected:
            raise SystemExit(f"allreduce at {point} gave {values}, expected {expected}")
    print(f"allreduce over {len(sums)} procs: {expected}")
    procs.stop().get()


if __name__ == "__main__":
    main()
