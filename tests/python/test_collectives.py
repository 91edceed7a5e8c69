"""castmesh.collectives from Python: a communicator inside the endpoints of
an actor mesh on real worker procs (every collective, point to point,
along/split, user-defined reductions over NumPy views, async requests,
errors), and world() in SPMD processes started with launcher variables."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import castmesh
from castmesh import Actor, endpoint, this_host
from castmesh import collectives

np = pytest.importorskip("numpy")


class Ranks(Actor):
    @endpoint
    def info(self):
        comm = collectives.current()
        return comm.rank, comm.size, comm.dims

    @endpoint
    def sums(self, n: int):
        comm = collectives.current()
        x = np.arange(n, dtype=np.float32) + comm.rank
        comm.allreduce(x)                                   # in place, torch-style
        out = np.empty(n, dtype=np.float64)
        comm.allreduce(np.full(n, comm.rank + 1.0), op="max", out=out)
        return float(x[-1]), float(out[0])

    @endpoint
    def everything(self):
        comm = collectives.current()
        r, size = comm.rank, comm.size
        got = {}
        b = np.full(3, 7 if r == 1 else 0, dtype=np.int64)
        got["bcast"] = comm.broadcast(b, root=1).tolist()
        got["allgather"] = np.from_dlpack(comm.allgather(np.array([r], dtype=np.int32))).ravel().tolist()
        g = comm.gather(np.array([r * 2], dtype=np.int32), root=0)
        got["gather"] = None if g is None else np.from_dlpack(g).ravel().tolist()
        piece = np.empty(1, dtype=np.int64)
        comm.scatter(np.arange(size, dtype=np.int64) * 10 if r == 0 else None, piece, root=0)
        got["scatter"] = int(piece[0])
        got["reduce_scatter"] = np.from_dlpack(comm.reduce_scatter(np.ones(size * 2, dtype=np.int32))).tolist()
        got["alltoall"] = np.from_dlpack(comm.alltoall(np.arange(size, dtype=np.int16) + 10 * r)).tolist()
        red = np.zeros(1, dtype=np.float64)
        comm.reduce(np.array([r + 1.0]), root=2, op="prod", out=red if r == 2 else None)
        got["reduce"] = float(red[0])
        comm.barrier()
        return got

    @endpoint
    def point_to_point(self):
        comm = collectives.current()
        if comm.rank == 0:
            buf = np.zeros(4, dtype=np.int64)
            statuses = []
            for _ in range(comm.size - 1):
                st = comm.recv(buf, source=collectives.ANY_SOURCE, tag=5, timeout=30)
                statuses.append((st.source, st.tag, st.bytes, int(buf[0])))
            return sorted(statuses)
        req = comm.isend(np.full(4, comm.rank * 100, dtype=np.int64), dest=0, tag=5)
        req.wait(timeout=30)
        return None

    @endpoint
    def groups_and_ops(self):
        comm = collectives.current()
        row = collectives.mesh_comm(dims=["gpus"])
        x = np.array([comm.rank], dtype=np.int64)
        row.allreduce(x)
        odd = comm.split(comm.rank % 2 if comm.rank % 2 else collectives.UNDEFINED, key=-comm.rank)
        # "append b's digits to a": associative, not commutative
        append = collectives.Op(lambda a, b: a * 10 ** np.ceil(np.log10(b + 1)).astype(np.int64) + b,
                                commutative=False, name="append")
        y = np.array([comm.rank + 1], dtype=np.int64)
        comm.allreduce(y, op=append)
        req = comm.allreduce(np.ones(1000, dtype=np.float64), async_op=True)
        done = req.wait(timeout=30)
        return int(x[0]), (None if odd is None else (odd.rank, odd.size)), int(y[0]), done is None

    @endpoint
    def errors(self):
        comm = collectives.current()
        out = {}
        try:
            comm.allreduce(np.ones(2, dtype=np.int32), op="avg")
        except ValueError as e:
            out["avg"] = "avg" in str(e)
        try:
            comm.allreduce(np.ones(2, dtype=np.int32), op="nope")
        except ValueError as e:
            out["unknown"] = "nope" in str(e)
        n = 4 if comm.rank == 0 else 5
        try:
            comm.allreduce(np.ones(n, dtype=np.float32))
            out["mismatch"] = "no error"
        except collectives.CommunicatorError as e:
            out["mismatch"] = ("count=4" in str(e) and "count=5" in str(e), e.code)
        try:
            comm.recv(np.zeros(1), source=0, tag=99, timeout=0.05)
        except TimeoutError:
            out["timeout"] = True
        return out


@pytest.fixture(scope="module")
def procs():
    p = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    yield p
    p.stop().get()


@pytest.fixture(scope="module")
def mesh(procs):
    return procs.spawn("ranks", Ranks)


@pytest.mark.timeout(120)
def test_mesh_on_a_proc_mesh_slice_has_its_own_communicator(procs):
    second_host = procs.slice(hosts=1).spawn("sliced", Ranks)
    infos = sorted(second_host.info.call().get().values())
    assert infos == [(0, 2, {"gpus": 2}), (1, 2, {"gpus": 2})]
    results = list(second_host.sums.call(3).get().values())
    assert results == [(2.0 + 3.0, 2.0)] * 2  # last of arange(3) + rank, summed over ranks 0 and 1


@pytest.mark.timeout(120)
def test_rank_size_and_dims(mesh):
    infos = mesh.info.call().get()
    assert sorted(v[0] for v in infos.values()) == [0, 1, 2, 3]
    assert all(v[1] == 4 and v[2] == {"hosts": 2, "gpus": 2} for v in infos.values())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [5, 200_000])
def test_allreduce_small_and_large(mesh, n):
    results = list(mesh.sums.call(n).get().values())
    assert all(r == results[0] for r in results)
    assert results[0] == (float(4 * (n - 1) + 6), 4.0)


@pytest.mark.timeout(120)
def test_every_collective(mesh):
    results = mesh.everything.call().get()
    for rank, got in enumerate(results.values()):
        assert got["bcast"] == [7, 7, 7]
        assert got["allgather"] == [0, 1, 2, 3]
        assert got["gather"] == ([0, 2, 4, 6] if rank == 0 else None)
        assert got["scatter"] == rank * 10
        assert got["reduce_scatter"] == [4, 4]
        assert got["alltoall"] == [rank + 10 * j for j in range(4)]
        assert got["reduce"] == (24.0 if rank == 2 else 0.0)


@pytest.mark.timeout(120)
def test_point_to_point_any_source(mesh):
    results = list(mesh.point_to_point.call().get().values())
    assert results[0] == [(1, 5, 32, 100), (2, 5, 32, 200), (3, 5, 32, 300)]


@pytest.mark.timeout(120)
def test_along_split_user_op_async(mesh):
    results = list(mesh.groups_and_ops.call().get().values())
    for rank, (row_sum, odd, appended, done) in enumerate(results):
        host = rank // 2
        assert row_sum == 4 * host + 1
        assert odd == ({3: (0, 2), 1: (1, 2)}.get(rank))
        assert appended == 1234
        assert done  # Request.wait() of a collective returns None (a Status only for receives)


@pytest.mark.timeout(120)
def test_errors_are_python_exceptions(mesh):
    for got in mesh.errors.call().get().values():
        assert got["avg"] and got["unknown"] and got["timeout"]
        assert got["mismatch"][0] is True, got["mismatch"]


def test_current_outside_an_actor_is_an_error():
    with pytest.raises(collectives.CommunicatorError, match="only available inside"):
        collectives.current()


SPMD = textwrap.dedent("""
    import numpy as np
    from castmesh import collectives
    comm = collectives.world()
    x = np.full(1000, comm.rank, dtype=np.float64)
    comm.allreduce(x)
    assert x[0] == sum(range(comm.size)), x[0]
    print("rank", comm.rank, "of", comm.size, "ok")
""")


@pytest.mark.timeout(120)
def test_world_in_processes_started_like_mpirun(tmp_path):
    script = tmp_path / "spmd.py"
    script.write_text(SPMD)
    env = dict(os.environ, OMPI_COMM_WORLD_SIZE="3", CASTMESH_RENDEZVOUS=f"unix:{tmp_path}/rendezvous.sock",
               CASTMESH_SECRET="pytest-secret", CASTMESH_LOG=os.environ.get("CM_DEBUG_LOG", "warn"))
    ranks = [subprocess.Popen([sys.executable, str(script)], env=dict(env, OMPI_COMM_WORLD_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    outputs = [p.communicate(timeout=90)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0, 0], "\n".join(outputs)
    assert all(f"rank {r} of 3 ok" in outputs[r] for r in range(3)), outputs
