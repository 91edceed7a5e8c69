"""castmesh.tensor_engine: clear errors without a backend, and, through the
FAKE tensor_engine plugin built for the C++ tests (no GPU here), device
memory, streams, copies and DLPack export from Python (in a subprocess, so
the plugin search path is set before discovery)."""

import os
import subprocess
import sys
import textwrap

import pytest

import castmesh
from castmesh import tensor_engine as te

FAKE_DIR = os.environ.get("CASTMESH_TEST_FAKE_TE_DIR", "")


def _backend_loaded() -> bool:
    return any(b.name == "tensor_engine" and b.state == "loaded" for b in castmesh.backends())


@pytest.mark.skipif(os.environ.get("CASTMESH_BACKEND_PATH") is not None, reason="a backend path is set")
def test_without_backend_every_call_says_how_to_install():
    if _backend_loaded():
        pytest.skip("a tensor_engine backend is loaded here")
    for call in (te.devices, lambda: te.Stream("cuda:0"), lambda: te.empty((4,), "float32", "cuda:0")):
        with pytest.raises(RuntimeError, match=r'pip install "castmesh\[tensor-engine\]"'):
            call()
    # The core keeps working.
    assert castmesh.zeros((2,), "float32").tolist() == [0.0, 0.0]


def test_bad_device_names_are_value_errors():
    for bad in ("gpu:0", "cuda:x", "cuda:-1"):
        with pytest.raises(ValueError, match="expected 'cuda'"):
            te.empty((1,), "float32", bad)


@pytest.mark.skipif(not FAKE_DIR or not os.path.isdir(FAKE_DIR), reason="fake tensor_engine plugin not built")
def test_fake_backend_memory_streams_copies_and_dlpack():
    script = textwrap.dedent("""
        import castmesh
        from castmesh import tensor_engine as te
        devs = te.devices()
        assert [d["index"] for d in devs] == [0, 1, 2, 3], devs
        assert devs[0]["kind"] == "cuda" and devs[0]["name"].startswith("FakeCUDA")
        s = te.Stream("cuda:1")
        assert s.device == "cuda:1"
        x = te.empty((3,), "int32", "cuda:1")
        assert x.__dlpack_device__() == (2, 1)          # kDLCUDA, index 1
        src = castmesh.zeros((3,), "int32")
        import array
        host = array.array("i", [7, 8, 9])
        te.copy(x, host, s)
        out = castmesh.zeros((3,), "int32")
        te.copy(out, x, s)
        s.synchronize()
        assert s.query()
        assert out.tolist() == [7, 8, 9], out.tolist()
        other = te.Stream("cuda:1")
        ev = te.Event("cuda:1")
        te.copy(x, array.array("i", [4, 5, 6]), s)
        ev.record(s)
        ev.wait(other)                                  # other's copy runs after s's
        te.copy(out, x, other)
        ev.synchronize()
        other.synchronize()
        assert ev.query() and out.tolist() == [4, 5, 6], out.tolist()
        try:
            te.copy(out, x, te.Stream("cuda:0"))
        except ValueError as e:
            assert "stream of cuda:0" in str(e), e
        else:
            raise AssertionError("a stream of another device was accepted")
        print("ok")
    """)
    env = dict(os.environ, CASTMESH_BACKEND_PATH=FAKE_DIR)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")


_ACTOR_MODULE = textwrap.dedent("""
    import array
    import castmesh
    from castmesh import Actor, endpoint, collectives
    from castmesh import tensor_engine as te


    class DeviceRank(Actor):
        @endpoint
        def run(self):
            comm = collectives.current()
            s = te.Stream("cuda:0")
            x = te.empty((3,), "int32", "cuda:0")
            te.copy(x, array.array("i", [1, 2, 3]), s)
            req = comm.allreduce(x, op="max", async_op=True, stream=s)
            after = te.Stream("cuda:0")
            req.wait_stream(after)
            out = castmesh.zeros((3,), "int32")
            te.copy(out, x, after)
            after.synchronize()
            req.wait()
            gathered = comm.allgather(x, stream=s)          # output made on the same device
            host = castmesh.zeros((3,), "int32")
            te.copy(host, gathered, s)                       # (1, 3) -> (3,): same dtype and count
            s.synchronize()
            try:
                comm.allreduce(x, op="band")
                unsupported = ""
            except NotImplementedError as e:
                unsupported = str(e)
            return out.tolist(), gathered.__dlpack_device__(), host.tolist(), unsupported
""")


@pytest.mark.timeout(180)
@pytest.mark.skipif(not FAKE_DIR or not os.path.isdir(FAKE_DIR), reason="fake tensor_engine plugin not built")
def test_fake_backend_collectives_on_device_tensors(tmp_path):
    """castmesh.collectives on device tensors from an actor of a one-proc mesh (the fake NCCL's ranks meet
    only inside one process, so one rank: the dispatch, streams and errors are what is checked)."""
    (tmp_path / "te_actor_mod.py").write_text(_ACTOR_MODULE)
    script = textwrap.dedent("""
        from castmesh import this_host
        from te_actor_mod import DeviceRank
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        mesh = procs.spawn("dev", DeviceRank)
        print(repr(list(mesh.run.call().get().values())[0]))
        procs.stop().get()
    """)
    env = dict(os.environ, CASTMESH_BACKEND_PATH=FAKE_DIR,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    out, device, host, unsupported = eval(done.stdout.strip().splitlines()[-1])
    assert out == [1, 2, 3]
    assert tuple(device) == (2, 0)
    assert host == [1, 2, 3]
    assert "stage" in unsupported or "host" in unsupported, unsupported
