"""Monarch spellings that code ported by changing its import relies on:
ProcMesh.initialized and ``async with`` on proc meshes; castmesh.rdma's
backend queries, warning classes and RDMAAction.read_remote(dst, src)."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest

from castmesh import Actor, ProcError, endpoint, this_host
from castmesh import rdma
from castmesh.rdma import RDMAAction, RDMABuffer


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


@pytest.mark.timeout(120)
def test_proc_mesh_initialized_and_async_with():
    async def run() -> None:
        async with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
            assert await procs.initialized is None
            assert list((await procs.spawn("echo", Echo).echo.call(3)).values()) == [3, 3]
        with pytest.raises(ProcError, match="stopped"):
            await procs.initialized
        with pytest.raises(ProcError, match="stopped"):
            procs.initialized.get()

    asyncio.run(run())


def test_rdma_backend_queries_agree():
    ibverbs = rdma.is_ibverbs_available()
    assert rdma.get_rdma_backend() == ("ibverbs" if ibverbs else "tcp")
    with pytest.warns(DeprecationWarning, match="is_ibverbs_available"):
        assert rdma.is_rdma_available() is ibverbs
    buffer = RDMABuffer(bytearray(16))
    assert buffer.backend() == ("ibverbs" if "ibverbs" in buffer.transports else "tcp")
    for kind in (rdma.RDMAReadTransferWarning, rdma.RDMAWriteTransferWarning, rdma.RDMATcpFallbackWarning):
        assert issubclass(kind, Warning)
        warnings.filterwarnings("ignore", category=kind)  # what Monarch code does with them


@pytest.mark.timeout(60)
def test_rdma_action_read_remote_takes_monarchs_order_and_the_old_one_with_a_warning():
    source = bytearray(b"0123456789abcdef")
    buffer = RDMABuffer(source)
    dst = bytearray(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Monarch's order warns nothing
        RDMAAction().read_remote(dst, buffer, offset=4).submit().get()
    assert dst == b"4567"
    old = bytearray(4)
    with pytest.warns(DeprecationWarning, match="Monarch's order"):
        action = RDMAAction().read_remote(buffer, old, offset=8)
    action.submit().get()
    assert old == b"89ab"
    with pytest.raises(TypeError, match="src must be an RdmaBuffer"):
        RDMAAction().read_remote(dst, bytearray(4))
    written = bytearray(b"WXYZ")
    RDMAAction().write_remote(buffer, written, offset=12).submit().get()  # (dst buffer, src memory)
    assert source[12:] == b"WXYZ"
    buffer.release().get()


class Mortal(Actor):
    @endpoint
    def answer_or_die(self, doomed: int, go: str) -> int:
        import os
        import time

        from castmesh import current_rank

        rank = current_rank().rank
        if rank == doomed:
            os._exit(3)  # the proc dies mid-call
        for _ in range(1200):  # the others answer once the controller has seen the death (a hang guard)
            if os.path.exists(go):
                break
            time.sleep(0.05)
        return rank


@pytest.mark.timeout(120)
def test_stream_keeps_the_survivors_results_when_a_member_dies(faults, tmp_path):
    go = tmp_path / "go"
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        mortals = procs.spawn("mortal", Mortal)
        futures = list(mortals.answer_or_die.stream(2, str(go)))
        for _ in range(1200):
            if faults:
                break
            time.sleep(0.05)
        assert faults, "the death of gpus=2 was not reported"
        go.write_text("")
        outcomes = [(f.exception(60), f) for f in futures]
        values = sorted(f.get(0) for error, f in outcomes if error is None)
        errors = [error for error, _ in outcomes if error is not None]
        assert values == [0, 1, 3], outcomes
        assert len(errors) == 1 and isinstance(errors[0], ProcError), errors
        assert "mortal[2]" in str(errors[0]), errors[0]
    finally:
        procs.stop().get()


class SelfStopping(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def stop_myself(self) -> str:
        from castmesh import context

        context().actor_instance.stop()
        return "stopping"  # this answer still goes out

    @endpoint
    def abort_myself(self) -> None:
        from castmesh import context

        try:
            context().actor_instance.abort("the weights are corrupt")
        except Exception:  # noqa: BLE001 - an abort is no Exception: it fails the actor
            pass


@pytest.mark.timeout(120)
def test_actor_instance_stop_and_abort_and_stop_reason(faults):
    from castmesh import ActorFailedError, SupervisionError, context

    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        actors = procs.spawn("selfish", SelfStopping)
        assert actors.slice(gpus=0).stop_myself.call_one().get(timeout=30) == "stopping"
        with pytest.raises(SupervisionError):
            for _ in range(600):  # until the stop has gone through (a hang guard)
                actors.slice(gpus=0).ping.call_one().get(timeout=30)
                time.sleep(0.05)
        with pytest.raises(ActorFailedError, match="the weights are corrupt"):
            actors.slice(gpus=1).abort_myself.call_one().get(timeout=30)
        for _ in range(600):
            if faults:
                break
            time.sleep(0.05)
        assert len(faults) == 1 and "the weights are corrupt" in faults[0].reason  # the abort; the stop is none
        actors.slice(gpus=2).stop(reason="done with it").get(timeout=30)
        with pytest.raises(SupervisionError, match="the mesh was stopped: done with it"):
            actors.slice(gpus=2).ping.call_one().get(timeout=30)
        with pytest.raises(RuntimeError, match="controller"):
            context().actor_instance.stop()
    finally:
        procs.stop().get()
