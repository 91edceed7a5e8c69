"""RL weight sync over RDMA buffers (Monarch's pattern): a trainer actor
publishes its weights as an RdmaBuffer after each step; generator actors in
other procs pull them with read_into, without the trainer's actor taking part.

Run: python examples/python/weight_sync.py   (with castmesh and numpy importable)

Each pull prints the transport that moved the bytes: "single_copy" between
procs of one host, "shared_segment" there where the kernel refuses
cross-memory attach, "socket" across hosts, "ibverbs" where an RDMA NIC
carries it.
"""
import numpy as np
from castmesh import Actor, endpoint, this_host, current_rank
from castmesh.rdma import RdmaBuffer

N = 4 << 20  # 4 Mi float32 weights = 16 MiB


class Trainer(Actor):
    def __init__(self):
        self.weights = np.zeros(N, dtype=np.float32)
        self.handle = RdmaBuffer(self.weights, "r")  # registered once; generators only read

    @endpoint
    def step(self, lr: float) -> RdmaBuffer:
        self.weights += lr  # stands in for an optimizer step, in place
        return self.handle


class Generator(Actor):
    def __init__(self):
        self.weights = np.empty(N, dtype=np.float32)

    @endpoint
    def sync(self, handle: RdmaBuffer) -> tuple:
        result = handle.read_into(self.weights).get(timeout=60)
        return current_rank().rank, float(self.weights[0]), result.transport


procs = this_host().spawn_procs(per_host={"gpus": 4})
trainer = procs.slice(gpus=0).spawn("trainer", Trainer)
generators = procs.slice(gpus=slice(1, 4)).spawn("generator", Generator)
for step in range(3):
    handle = trainer.step.call_one(0.5).get()
    for rank, first, transport in sorted(generators.sync.call(handle).get().values()):
        print(f"step {step}: generator {rank} has w[0]={first} via {transport}")
        assert first == 0.5 * (step + 1)
handle.release().get()
procs.stop().get()
print("weight sync OK")
