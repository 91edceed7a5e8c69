"""The castmesh Python quick start: a Counter actor on a mesh of 4 worker procs.

Run: python examples/python/counter.py   (with castmesh installed or on PYTHONPATH)
"""
import asyncio
from castmesh import Actor, endpoint, this_host, current_rank

class Counter(Actor):
    def __init__(self, start: int):
        self.value = start
    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by
    @endpoint
    async def get(self) -> int:
        return self.value

procs = this_host().spawn_procs(per_host={"gpus": 4})
counters = procs.spawn("counter", Counter, 0)
counters.incr.broadcast(2)
print(counters.get.call().get())          # ValueMesh: 2 at each point
print(counters.slice(gpus=1).get.call_one().get())
async def main():
    print(await counters.slice(gpus=0).get.call_one())   # futures are awaitable
asyncio.run(main())
