"""castmesh.MPI (mpi4py's API, docs/mpi4py.md): datatypes, buffer specs and ops in this
process; between real processes under ``mpirun`` (mpi_ranks_script.py: buffer specs,
derived datatypes, objects, MAXLOC/MINLOC, persistent requests, Bsend, Probe, errors);
a program started alone (a world of one); and COMM_WORLD inside actors (the mesh's
communicator)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from castmesh import MPI  # noqa: E402 - after the NumPy skip
from castmesh import Actor, endpoint, this_host  # noqa: E402

HERE = Path(__file__).resolve().parent
MPIRUN = shutil.which("mpirun")


# ---- in this process: no communicator needed ----

def test_predefined_datatypes_have_mpi_sizes():
    assert [t.size for t in (MPI.BYTE, MPI.CHAR, MPI.SHORT, MPI.INT, MPI.LONG, MPI.FLOAT, MPI.DOUBLE)] == [1, 1, 2, 4, 8, 4, 8]
    assert (MPI.INT8_T.size, MPI.UINT16_T.size, MPI.INT64_T.size, MPI.C_BOOL.size) == (1, 2, 8, 1)
    assert (MPI.DOUBLE_INT.size, MPI.DOUBLE_INT.extent) == (12, 16)
    assert (MPI.TWOINT.size, MPI.FLOAT_INT.size, MPI.SHORT_INT.size, MPI.LONG_INT.extent) == (8, 8, 6, 16)
    assert MPI.DOUBLE.Get_extent() == (0, 8) and MPI.DOUBLE.name == "MPI_DOUBLE"


def test_derived_datatypes_bounds_like_mpi():
    s = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.CHAR])
    assert (s.size, s.extent, s.lb, s.ub) == (9, 16, 0, 16)   # padded to the double's alignment
    v = MPI.DOUBLE.Create_vector(3, 1, -2)
    assert (v.size, v.extent, v.lb, v.ub) == (24, 40, -32, 8)
    r = MPI.INT.Create_resized(0, 16)
    assert (r.size, r.extent) == (4, 16)
    c = s.Create_contiguous(3)
    assert c.extent == 48 and c.size == 27
    h = MPI.INT.Create_hvector(2, 3, 20)
    assert (h.size, h.extent) == (24, 32)
    idx = MPI.INT.Create_indexed([2, 1], [3, 0])
    assert (idx.size, idx.lb, idx.ub) == (12, 0, 20)
    for t in (s, v, r, c, h, idx):
        t.Free()
        assert t == MPI.DATATYPE_NULL
    with pytest.raises(MPI.Exception):
        MPI.INT.Free()


def test_pack_and_unpack_follow_the_type_map_order():
    a = np.arange(9, dtype="i").reshape(3, 3)
    column_major = MPI.INT.Create_vector(3, 1, 3).Create_hvector(3, 1, 4).Commit()  # the transpose
    packed = bytearray(36)
    assert column_major.Pack(a, packed, 0) == 36
    assert np.frombuffer(packed, dtype="i").tolist() == a.T.ravel().tolist()
    back = np.zeros((3, 3), dtype="i")
    assert column_major.Unpack(packed, 0, back) == 36
    assert back.tolist() == a.tolist()


def test_buffer_specs_count_and_errors():
    from castmesh._mpi.buffers import message, vector_message
    a = np.zeros(10, dtype="d")
    assert (message(a, False).count, message(a, False).datatype) == (10, MPI.DOUBLE)
    assert message([a, MPI.INT], False).count == 20
    m = message([a, (3, 2), MPI.DOUBLE], False)
    assert (m.count, m.offset, m.data().size) == (3, 16, 24)
    assert message(bytearray(5), True).datatype == MPI.UNSIGNED_CHAR
    with pytest.raises(ValueError, match="buffer too small"):
        message([a, 11, MPI.DOUBLE], False)           # wrong count
    with pytest.raises(ValueError, match="not a multiple"):
        message([np.zeros(3, dtype="b"), MPI.INT], False)
    with pytest.raises(BufferError, match="not contiguous"):
        message(np.zeros((4, 4))[:, 1], False)
    with pytest.raises(BufferError, match="read-only"):
        message(b"abc", True)
    with pytest.raises(TypeError, match="expected a buffer"):
        message([[1, 2, 3], MPI.INT], False)
    v = vector_message([np.zeros(6, dtype="i"), [1, 2, 3], MPI.INT], 3, True)
    assert (v.counts, v.displs) == ([1, 2, 3], [0, 1, 3])
    with pytest.raises(ValueError, match="expected 2 counts"):
        vector_message([np.zeros(6, dtype="i"), [1, 2, 3], MPI.INT], 2, True)


def test_ops_on_python_objects():
    assert MPI.SUM(2, 3) == 5 and MPI.PROD(2, 3) == 6 and MPI.MAX(3, 5) == 5 and MPI.MIN(3, 5) == 3
    assert MPI.LAND(2, 3) is True and MPI.LXOR(1, 0) is True and MPI.BXOR(6, 3) == 5
    assert MPI.MAXLOC((3, 1), (3, 0)) == (3, 0) and MPI.MINLOC((1, 5), (2, 0)) == (1, 5)
    op = MPI.Op.Create(lambda a, b, t: ("user", a, b, t), commute=True)
    assert op(1, 2) == ("user", 1, 2, None) and op.Is_commutative() and not op.is_predefined
    assert MPI.SUM.is_predefined and all(o.Is_commutative() for o in (MPI.SUM, MPI.MAXLOC, MPI.BAND))
    op.Free()


def test_status_counts():
    st = MPI.Status()
    assert (st.Get_source(), st.Get_tag(), st.Get_error(), st.Get_count()) == (MPI.ANY_SOURCE, MPI.ANY_TAG, 0, 0)
    st.set(1, 7, 12)
    assert st.Get_count(MPI.INT) == 3 and st.Get_count(MPI.DOUBLE) == MPI.UNDEFINED and st.Get_elements(MPI.INT) == 3


def test_unsupported_calls_raise_not_implemented_naming_them():
    for name in ("Win", "File", "Comm_spawn", "Open_port", "Group", "Cartcomm"):
        with pytest.raises(NotImplementedError, match=name):
            getattr(MPI, name)
    with pytest.raises(NotImplementedError, match="Intracomm.Spawn"):
        MPI.Intracomm.Spawn
    with pytest.raises(NotImplementedError, match="Intracomm.Create_cart"):
        MPI.COMM_NULL.Create_cart
    with pytest.raises(NotImplementedError, match="Datatype.Create_subarray"):
        MPI.DOUBLE.Create_subarray
    with pytest.raises(AttributeError):  # dunder lookups (copy, pickle, tools) stay AttributeErrors
        MPI.__wrapped__
    with pytest.raises(MPI.Exception, match="MPI_ERR_COMM"):
        MPI.COMM_NULL.Get_rank()


def test_constants():
    assert MPI.PROC_NULL not in (MPI.ANY_SOURCE, MPI.UNDEFINED) and MPI.SUCCESS == 0
    assert MPI.BSEND_OVERHEAD > 0 and MPI.IN_PLACE is not None and MPI.REQUEST_NULL == MPI.Request()
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE and MPI.Wtick() > 0 and isinstance(MPI.Get_processor_name(), str)
    assert str(MPI.Exception(MPI.ERR_TRUNCATE)).startswith("MPI_ERR_TRUNCATE")


# ---- real processes ----

def _env() -> dict:
    return dict(os.environ, CASTMESH_LOG=os.environ.get("CM_DEBUG_LOG", "warn"),
                PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


@pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="mpirun under the preloaded ASan runtime: runs in the dev and wheel stages")
@pytest.mark.parametrize("ranks", [2, 3, 4])  # 4: more ranks than the 2 cores CI has
@pytest.mark.timeout(120)
def test_between_processes_under_mpirun(ranks):
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", str(ranks), sys.executable,
                           str(HERE / "mpi_ranks_script.py")], env=_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = ["buffer_specs", "derived_datatypes", "objects", "maxloc_minloc", "ops", "vector_collectives",
              "persistent_requests", "bsend", "probe", "requests", "errors", "fast_path", "communicators"]
    for name in checks:
        for r in range(ranks):
            assert f"OK {name} rank={r}" in proc.stdout, f"{name} on rank {r}:\n{proc.stdout}\n{proc.stderr}"


SINGLETON = textwrap.dedent("""
    import numpy as np
    from castmesh import MPI
    comm = MPI.COMM_WORLD
    assert (comm.Get_rank(), comm.Get_size()) == (0, 1)
    x = np.arange(4.0)
    y = np.zeros(4)
    comm.Allreduce(x, y, op=MPI.SUM)
    comm.Send(x, 0, 3)
    comm.Recv(y[::-1].copy(), 0, 3)
    assert comm.allgather("me") == ["me"] and (y == x).all()
    print("singleton ok")
""")


@pytest.mark.timeout(60)
def test_a_program_started_alone_is_a_world_of_one(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text(SINGLETON)
    env = {k: v for k, v in _env().items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_", "CASTMESH_RANK"))}
    runs = [subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for _ in range(2)]  # two at once: each is its own world
    for p in runs:
        out = p.communicate(timeout=50)[0]
        assert p.returncode == 0 and "singleton ok" in out, out


class MpiActor(Actor):
    @endpoint
    def world(self):
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        total = np.zeros(1)
        comm.Allreduce(np.array([rank + 1.0]), total, op=MPI.SUM)
        got = np.zeros(1, dtype="i")
        comm.Sendrecv(np.array([rank], dtype="i"), (rank + 1) % size, 0, got, (rank - 1) % size, 0)
        return rank, size, float(total[0]), int(got[0]), comm.allgather(rank)


@pytest.mark.timeout(120)
def test_comm_world_inside_actors_is_the_mesh():
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    mesh = procs.spawn("mpi", MpiActor)
    results = sorted(mesh.world.call().get().values())
    assert results == [(r, 3, 6.0, (r - 1) % 3, [0, 1, 2]) for r in range(3)], results
