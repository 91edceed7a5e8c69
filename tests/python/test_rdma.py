"""castmesh.rdma from Python: buffers registered by actors on real worker
procs, read and written from the controller and from other actors (NumPy,
bytearray, memoryview), batches, release, errors, pickled handles, and
Monarch-style code using the RDMABuffer / RDMAAction / drop aliases."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import castmesh
from castmesh import Actor, endpoint, this_host
from castmesh.rdma import RdmaBatch, RdmaBuffer, RdmaError, RdmaResult

np = pytest.importorskip("numpy")


class Trainer(Actor):
    """Owns weights and offers them as RDMA buffers."""

    def __init__(self) -> None:
        self.weights = np.zeros(0, dtype=np.float32)

    @endpoint
    def publish(self, n: int, step: float, access: str = "rw") -> RdmaBuffer:
        self.weights = np.arange(n, dtype=np.float32) * step
        return RdmaBuffer(self.weights, access)

    @endpoint
    def checksum(self) -> float:
        return float(self.weights.astype(np.float64).sum())

    @endpoint
    def head(self, k: int) -> list:
        return self.weights[:k].tolist()


class Generator(Actor):
    """Pulls weights it was handed (Monarch's RL weight-sync pattern)."""

    @endpoint
    def pull(self, buf: RdmaBuffer, n: int) -> tuple:
        local = np.empty(n, dtype=np.float32)
        result = buf.read_into(local).get(timeout=60)
        return float(local.astype(np.float64).sum()), result.transport


@pytest.fixture(scope="module")
def procs():
    p = this_host().spawn_procs(per_host={"gpus": 2})
    yield p
    p.stop().get(timeout=60)


@pytest.fixture(scope="module")
def trainer(procs):
    return procs.slice(gpus=0).spawn("trainer", Trainer)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "switches, transport",
    [({"rdma_single_copy": False}, "shared_segment"),
     ({"rdma_single_copy": False, "rdma_shared_segment": False}, "socket")],
)
def test_same_host_paths_forced_by_the_switches(trainer, switches, transport):
    n = 300_000  # above the 64 KiB below which same-host operations use the socket anyway
    buf = trainer.publish.call_one(n, 0.25).get(timeout=60)
    with castmesh.config.configured(**switches):  # read by this (the requesting) process per operation
        local = np.empty(n, dtype=np.float32)
        result = buf.read_into(local).get(timeout=60)
        assert (result.bytes, result.transport) == (n * 4, transport)
        np.testing.assert_array_equal(local, np.arange(n, dtype=np.float32) * 0.25)
        update = np.full(n, 3.0, dtype=np.float32)
        assert buf.write_from(update).get(timeout=60).transport == transport
    assert trainer.head.call_one(3).get(timeout=60) == [3.0, 3.0, 3.0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_controller_reads_and_writes_a_trainers_buffer(trainer, n):
    buf = trainer.publish.call_one(n, 0.5).get(timeout=60)
    assert buf.size() == n * 4
    local = np.empty(n, dtype=np.float32)
    result = buf.read_into(local).get(timeout=60)
    assert type(result) is RdmaResult and result == (n * 4, result.transport)  # built by the binding
    assert result.bytes == n * 4
    assert result.transport in ("single_copy", "shared_segment", "socket")
    np.testing.assert_array_equal(local, np.arange(n, dtype=np.float32) * 0.5)
    update = np.ones(n, dtype=np.float32)
    buf.write_from(update).get(timeout=60)
    assert trainer.checksum.call_one().get(timeout=60) == pytest.approx(float(n))
    buf.release().get(timeout=60)


@pytest.mark.timeout(120)
def test_offsets_lengths_bytearray_and_memoryview(trainer):
    buf = trainer.publish.call_one(1024, 1.0).get(timeout=60)
    raw = bytearray(16)
    buf.read_into(raw, offset=8 * 4, length=16).get(timeout=60)
    assert np.frombuffer(raw, dtype=np.float32).tolist() == [8.0, 9.0, 10.0, 11.0]
    buf.write_from(memoryview(np.array([-1.0, -2.0], dtype=np.float32)), 4).get(timeout=60)  # positional offset
    assert trainer.head.call_one(3).get(timeout=60) == [0.0, -1.0, -2.0]


@pytest.mark.timeout(120)
def test_generators_in_other_procs_pull_a_handle_they_were_sent(procs, trainer):
    buf = trainer.publish.call_one(200_000, 2.0).get(timeout=60)
    generators = procs.spawn("generators", Generator)
    pulled = generators.pull.call(buf, 200_000).get(timeout=60)
    expected = float((np.arange(200_000, dtype=np.float64) * 2.0).sum())
    for total, transport in pulled.values():
        assert total == pytest.approx(expected)
        assert transport in ("same_process", "single_copy", "shared_segment", "socket")
    # The one on the trainer's own proc reads within its process.
    assert sorted(t for _, t in pulled.values())[0] in ("same_process", "single_copy", "shared_segment")


@pytest.mark.timeout(120)
def test_batch_mixes_reads_and_writes_and_refuses_overlapping_writes(trainer):
    buf = trainer.publish.call_one(100, 1.0).get(timeout=60)
    a, b = np.empty(10, dtype=np.float32), np.empty(5, dtype=np.float32)
    results = (RdmaBatch()
               .read_into(buf, a, offset=0)
               .read_into(buf, b, offset=50 * 4)
               .write_from(buf, np.full(2, 7.0, dtype=np.float32), offset=90 * 4)
               .submit().get(timeout=60))
    assert [r.bytes for r in results] == [40, 20, 8]
    assert all(type(r) is RdmaResult for r in results)
    assert a.tolist() == list(range(10)) and b.tolist() == [50.0, 51.0, 52.0, 53.0, 54.0]
    batch = RdmaBatch().write_from(buf, np.zeros(4, dtype=np.float32), offset=0)
    batch.write_from(buf, np.zeros(4, dtype=np.float32), offset=8)
    with pytest.raises(ValueError, match="overlaps"):
        batch.submit()


@pytest.mark.timeout(120)
def test_errors_are_clear_and_raised_before_bytes_move(trainer):
    buf = trainer.publish.call_one(10, 1.0, "r").get(timeout=60)
    dst = np.zeros(20, dtype=np.float32)
    with pytest.raises(ValueError, match="outside"):
        buf.read_into(dst).get(timeout=60)
    with pytest.raises(PermissionError, match="without write access"):
        buf.write_from(np.zeros(1, dtype=np.float32)).get(timeout=60)
    with pytest.raises(BufferError):
        buf.read_into(bytes(40)).get(timeout=60)  # read-only destination
    assert dst.tolist() == [0.0] * 20
    buf.drop().get(timeout=60)
    with pytest.raises(RdmaError, match="released") as info:
        buf.read_into(np.zeros(10, dtype=np.float32)).get(timeout=60)
    assert info.value.code == "FAILED_PRECONDITION"


@pytest.mark.timeout(60)
def test_handles_pickle_and_await(trainer):
    buf = trainer.publish.call_one(64, 3.0).get(timeout=60)
    again = pickle.loads(pickle.dumps(buf))
    assert again.size() == 256 and again.owner == buf.owner
    local = np.empty(64, dtype=np.float32)

    async def pull():
        return await again.read_into(local)

    result = asyncio.run(pull())
    assert result.bytes == 256 and local[-1] == 63 * 3.0


def test_registering_needs_a_writable_buffer_for_write_access():
    with pytest.raises(BufferError):
        RdmaBuffer(b"immutable bytes")


MONARCH_STYLE = textwrap.dedent(
    """
    # Monarch's weight-sync example with only the import changed.
    import numpy as np
    from castmesh import Actor, endpoint, this_host
    from castmesh.rdma import RDMABuffer, RDMAAction

    class Trainer(Actor):
        def __init__(self):
            self.w = np.arange(1000, dtype=np.float32)
        @endpoint
        def weights_handle(self) -> RDMABuffer:
            return RDMABuffer(self.w)

    class Generator(Actor):
        @endpoint
        def update(self, handle: RDMABuffer) -> float:
            w = np.zeros(1000, dtype=np.float32)
            handle.read_into(w).get()
            extra = np.zeros(10, dtype=np.float32)
            RDMAAction().read_remote(extra, handle, offset=40).submit().get()  # Monarch's order
            return float(w.sum() + extra[0])

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    trainer = procs.slice(gpus=0).spawn("trainer", Trainer)
    generator = procs.slice(gpus=1).spawn("generator", Generator)
    handle = trainer.weights_handle.call_one().get()
    print("SUM", generator.update.call_one(handle).get())
    handle.drop().get()
    procs.stop().get()
    """
)


@pytest.mark.timeout(120)
def test_monarch_style_code_ports_by_changing_the_import(tmp_path):
    script = tmp_path / "monarch_style.py"
    script.write_text(MONARCH_STYLE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUM 499510.0" in out.stdout, out.stdout + out.stderr
