"""castmesh.collectives' timeouts and requests from Python: a blocking
collective whose peer never arrives raises CommunicatorTimeoutError (also a
TimeoutError) naming that peer and leaves the communicator broken; a receive
that times out leaves it usable; the communicator's default timeout; awaitable
requests; an out= of the wrong size is named."""

from __future__ import annotations

import array

import pytest

from castmesh import Actor, endpoint, this_host
from castmesh import collectives
from castmesh.collectives import CommunicatorError, CommunicatorTimeoutError

TIMEOUT_S = 1.0


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "timeout": isinstance(e, TimeoutError),
            "communicator": isinstance(e, CommunicatorError), "message": str(e),
            "missing": getattr(e, "missing_ranks", None), "code": getattr(e, "code", None)}


class Member(Actor):
    @endpoint
    def allreduce_unless(self, absent: int) -> dict:
        comm = collectives.current()
        if comm.rank == absent:
            return {}
        got = {}
        try:
            comm.allreduce(array.array("d", [1.0] * 8), timeout=TIMEOUT_S)
            got["first"] = "completed"
        except CommunicatorError as e:
            got["first"] = _error(e)
        # Broken now, for every handle on the group in this process.
        again = collectives.current()
        got["broken"] = again.broken
        for name, call in (("barrier", lambda: again.barrier(timeout=60)),
                           ("allreduce", lambda: again.allreduce(array.array("d", [1.0]))),
                           ("recv", lambda: again.recv(array.array("d", [0.0]), timeout=60))):
            try:
                call()
                got[name] = "completed"
            except CommunicatorError as e:
                got[name] = _error(e)
        return got

    @endpoint
    def late_allreduce(self) -> dict:
        try:
            collectives.current().allreduce(array.array("d", [1.0] * 8), timeout=60)
            return {"late": "completed"}
        except CommunicatorError as e:
            return {"late": _error(e)}

    @endpoint
    def recv_then_allreduce(self) -> dict:
        comm = collectives.current()
        got = {}
        if comm.rank == 0:
            try:
                comm.recv(array.array("d", [0.0]), source=1, tag=7, timeout=0.2)
                got["recv"] = "completed"
            except CommunicatorError as e:
                got["recv"] = _error(e)
        x = array.array("d", [comm.rank + 1.0])
        comm.allreduce(x, timeout=60)  # still usable
        got["sum"] = x[0]
        return got

    @endpoint
    def default_timeout(self) -> dict:
        comm = collectives.current(timeout=0.2)
        got = {"seen": collectives.current().timeout, "child": comm.along(list(comm.dims)).timeout}
        try:
            collectives.current().recv(array.array("d", [0.0]), source=(comm.rank + 1) % comm.size, tag=3)
            got["recv"] = "completed"
        except CommunicatorTimeoutError as e:
            got["recv"] = _error(e)
        for bad in (0, -1.0):
            try:
                comm.allreduce(array.array("d", [1.0]), timeout=bad)
                got[f"bad {bad}"] = "accepted"
            except ValueError as e:
                got[f"bad {bad}"] = str(e)
        comm.timeout = None
        return got

    @endpoint
    async def awaited(self) -> dict:
        comm = collectives.current()
        x = array.array("d", [comm.rank + 1.0] * 3)
        done = await comm.allreduce(x, async_op=True)
        got = {"done": done, "sum": list(x)}
        peer = comm.rank ^ 1
        send = comm.isend(array.array("d", [comm.rank * 10.0]), dest=peer, tag=4)
        into = array.array("d", [0.0])
        status = await comm.irecv(into, source=peer, tag=4)
        got["status"] = (status.source, status.tag, status.bytes, into[0])
        got["send"] = send.wait(timeout=30)
        got["blocking wait"] = comm.allreduce(array.array("d", [1.0]), async_op=True).wait(timeout=30)
        return got

    @endpoint
    def wrong_out(self, what: str) -> str:
        comm = collectives.current()
        x = array.array("d", [1.0] * 4)
        calls = {
            "allreduce": lambda: comm.allreduce(x, out=array.array("d", [0.0] * 5)),
            "allgather": lambda: comm.allgather(x, out=array.array("d", [0.0] * 3)),
            "alltoall": lambda: comm.alltoall(x, out=array.array("d", [0.0] * 2)),
            "reduce_scatter": lambda: comm.reduce_scatter(x, out=array.array("d", [0.0] * 4)),
        }
        try:
            calls[what]()
            return "completed"
        except ValueError as e:
            return str(e)


def _spawn(name: str):
    procs = this_host().spawn_procs(per_host={"procs": 4})
    return procs, procs.spawn(name, Member)


@pytest.mark.timeout(120)
def test_a_collective_whose_peer_never_arrives_times_out_naming_it_and_breaks_the_communicator():
    procs, members = _spawn("absent")
    try:
        results = list(members.allreduce_unless.call(3).get().values())
        assert results[3] == {}
        for rank, got in enumerate(results[:3]):
            first = got["first"]
            assert first != "completed"
            assert first["type"] == "CommunicatorTimeoutError" and first["timeout"] and first["communicator"], first
            assert first["missing"] == [3], first
            assert "rank 3 did not arrive" in first["message"], first["message"]
            assert f"on rank {rank}" in first["message"] and "broken" in first["message"]
            assert got["broken"] and "allreduce timed out" in got["broken"]
            for name in ("barrier", "allreduce", "recv"):
                assert got[name] != "completed", (name, got[name])
                assert got[name]["code"] == "FAILED_PRECONDITION" and "broken" in got[name]["message"], got[name]
                assert not got[name]["timeout"]  # at once, not after its own timeout
        # The rank that never came: its first call on the group fails at once, saying why.
        late = members.slice(procs=3).late_allreduce.call_one().get()["late"]
        assert late != "completed" and "broken" in late["message"] and "timed out" in late["message"], late
    finally:
        procs.stop().get()


@pytest.mark.timeout(120)
def test_a_receive_that_times_out_leaves_the_communicator_usable():
    procs, members = _spawn("recv")
    try:
        results = list(members.recv_then_allreduce.call().get().values())
        recv = results[0]["recv"]
        assert recv["type"] == "CommunicatorTimeoutError" and recv["timeout"] and recv["missing"] == [1], recv
        assert "nothing from rank 1" in recv["message"] and "stays usable" in recv["message"]
        assert [r["sum"] for r in results] == [10.0] * 4
    finally:
        procs.stop().get()


@pytest.fixture(scope="module")
def members():
    procs, mesh = _spawn("members")
    yield mesh
    procs.stop().get()


@pytest.mark.timeout(120)
def test_the_communicator_default_timeout_applies_to_every_handle(members):
    for got in members.default_timeout.call().get().values():
        assert got["seen"] == 0.2 and got["child"] == 0.2
        assert got["recv"]["timeout"] and "within 0.2s" in got["recv"]["message"], got["recv"]
        assert "positive" in got["bad 0"] and "positive" in got["bad -1.0"]


@pytest.mark.timeout(120)
def test_requests_are_awaitable_and_a_collective_wait_returns_none(members):
    for rank, got in enumerate(members.awaited.call().get().values()):
        assert got["done"] is None and got["sum"] == [10.0] * 3
        assert got["status"] == (rank ^ 1, 4, 8, (rank ^ 1) * 10.0)
        assert got["send"] is None and got["blocking wait"] is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what,size", [("allreduce", 5), ("allgather", 3), ("alltoall", 2), ("reduce_scatter", 4)])
def test_an_out_of_the_wrong_size_is_named(members, what, size):
    for message in members.wrong_out.call(what).get().values():
        assert message.startswith(f"{what}: out= has {size} elements"), message
