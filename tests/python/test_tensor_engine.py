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


_STREAM_PROTOCOL_SCRIPT = textwrap.dedent("""
    import array, ctypes, os
    import castmesh
    from castmesh import tensor_engine as te

    fake = ctypes.CDLL(os.path.join(os.environ["CASTMESH_BACKEND_PATH"], "libcastmesh_tensor_engine.so"))
    fake.castmesh_fake_te_hold.restype = ctypes.c_void_p
    fake.castmesh_fake_te_hold.argtypes = [ctypes.c_void_p]
    fake.castmesh_fake_te_release.argtypes = [ctypes.c_void_p]

    class FakeProducer:
        # A FAKE DLPack device producer: records the stream each __dlpack__ call names.
        def __init__(self, tensor):
            self.tensor = tensor
            self.streams = []
        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            self.streams.append(stream)
            return self.tensor.__dlpack__(stream=-1, max_version=max_version)

    # Consumer side: castmesh names the stream it will use.
    s = te.Stream("cuda:1")
    assert isinstance(s.native_handle, int) and s.native_handle not in (0, 1, 2)
    p = FakeProducer(te.empty((4,), "float32", "cuda:1"))
    v = castmesh.from_dlpack(p, stream=s)
    assert p.streams == [s.native_handle], p.streams
    assert v.__dlpack_device__() == (2, 1) and v.data_ptr == p.tensor.data_ptr
    castmesh.from_dlpack(p)                                   # default: castmesh's consume stream
    assert isinstance(p.streams[-1], int) and p.streams[-1] not in (None, s.native_handle), p.streams
    try:
        castmesh.from_dlpack(p, stream=te.Stream("cuda:0"))
    except ValueError as e:
        assert "stream of the array's device" in str(e), e
    else:
        raise AssertionError("a stream of another device was accepted")
    host_p = FakeProducer(castmesh.zeros((2,), "int32"))   # a host producer is asked without a stream
    castmesh.from_dlpack(host_p, stream=s)
    assert host_p.streams == [None], host_p.streams

    # Producer side: castmesh's pending work (a held copy into x) is ordered
    # before the consumer's stream, which the consumer names by its handle.
    x = te.empty((3,), "int32", "cuda:1")
    work = te.Stream("cuda:1")
    gate = fake.castmesh_fake_te_hold(work.native_handle)
    te.copy(x, array.array("i", [4, 5, 6]), work)
    consumer = te.Stream("cuda:1")
    capsule = x.__dlpack__(stream=consumer.native_handle, max_version=(1, 0))
    out = castmesh.zeros((3,), "int32")
    te.copy(out, x, consumer)
    held = consumer.query()
    fake.castmesh_fake_te_release(gate)
    consumer.synchronize()
    assert held is False, "the consumer's stream did not wait for castmesh's copy"
    assert out.tolist() == [4, 5, 6], out.tolist()
    # stream=-1: no ordering asked; stream=None: CUDA's legacy default stream.
    x.__dlpack__(stream=-1, max_version=(1, 0))
    x.__dlpack__(max_version=(1, 0))
    for bad, error in ((0, ValueError), ("s", TypeError)):
        try:
            x.__dlpack__(stream=bad, max_version=(1, 0))
        except error:
            pass
        else:
            raise AssertionError(f"stream={bad!r} was accepted")
    wrapped = te.Stream.from_native("cuda:1", consumer.native_handle)
    assert wrapped.native_handle == consumer.native_handle
    del wrapped
    consumer.synchronize()                                    # still alive: the wrap did not own it
    print("ok")
""")


@pytest.mark.skipif(not FAKE_DIR or not os.path.isdir(FAKE_DIR), reason="fake tensor_engine plugin not built")
def test_fake_backend_dlpack_stream_protocol():
    """The DLPack stream protocol both ways over the FAKE plugin: castmesh names its stream to a (fake) device
    producer, and a consumer's stream waits for castmesh's pending work on an exported device tensor."""
    env = dict(os.environ, CASTMESH_BACKEND_PATH=FAKE_DIR)
    done = subprocess.run([sys.executable, "-c", _STREAM_PROTOCOL_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")


_PRODUCER_ACTOR_MODULE = textwrap.dedent("""
    import array
    import castmesh
    from castmesh import Actor, endpoint, collectives
    from castmesh import tensor_engine as te


    class FakeProducer:
        # A FAKE DLPack device producer: records the stream each __dlpack__ call names.
        def __init__(self, tensor):
            self.tensor = tensor
            self.streams = []
        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            self.streams.append(stream)
            return self.tensor.__dlpack__(stream=-1, max_version=max_version)


    class ProducerRank(Actor):
        @endpoint
        def run(self):
            comm = collectives.current()
            s = te.Stream("cuda:0")
            x = te.empty((3,), "int32", "cuda:0")
            te.copy(x, array.array("i", [1, 2, 3]), s)
            p = FakeProducer(x)
            comm.allreduce(p, op="sum", stream=s)
            named = p.streams[-1] == s.native_handle
            comm.allreduce(p, op="sum")                  # no stream: castmesh's consume stream, named too
            default = p.streams[-1]
            out = castmesh.zeros((3,), "int32")
            te.copy(out, x, s)
            s.synchronize()
            return named, isinstance(default, int) and default != s.native_handle, out.tolist()
""")


@pytest.mark.timeout(180)
@pytest.mark.skipif(not FAKE_DIR or not os.path.isdir(FAKE_DIR), reason="fake tensor_engine plugin not built")
def test_fake_backend_collectives_name_their_stream_to_a_device_producer(tmp_path):
    """A collective on a (fake) DLPack device producer asks __dlpack__ with the stream it runs on."""
    (tmp_path / "te_producer_mod.py").write_text(_PRODUCER_ACTOR_MODULE)
    script = textwrap.dedent("""
        from castmesh import this_host
        from te_producer_mod import ProducerRank
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        mesh = procs.spawn("dev", ProducerRank)
        print(repr(list(mesh.run.call().get().values())[0]))
        procs.stop().get()
    """)
    env = dict(os.environ, CASTMESH_BACKEND_PATH=FAKE_DIR,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    named, default, out = eval(done.stdout.strip().splitlines()[-1])
    assert named and default
    assert out == [1, 2, 3]


_RDMA_ACTOR_MODULE = textwrap.dedent("""
    import array
    import castmesh
    from castmesh import Actor, endpoint
    from castmesh import tensor_engine as te
    from castmesh.rdma import RdmaBuffer


    class DeviceOwner(Actor):
        @endpoint
        def publish(self, n):
            s = te.Stream("cuda:0")
            self.x = te.empty((n,), "uint8", "cuda:0")
            te.copy(self.x, array.array("B", [i % 251 for i in range(n)]), s)
            s.synchronize()
            return RdmaBuffer(self.x)

""")


@pytest.mark.timeout(180)
@pytest.mark.skipif(not FAKE_DIR or not os.path.isdir(FAKE_DIR), reason="fake tensor_engine plugin not built")
def test_fake_backend_rdma_buffers_over_device_memory(tmp_path):
    """castmesh.rdma over (fake) CUDA memory: an actor's device buffer read into host and device memory of the
    controller and written from device memory, each result saying the bytes were staged through the host."""
    (tmp_path / "te_rdma_mod.py").write_text(_RDMA_ACTOR_MODULE)
    script = textwrap.dedent("""
        import array
        import castmesh
        from castmesh import this_host
        from castmesh import tensor_engine as te
        from te_rdma_mod import DeviceOwner
        n = 100000
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        owner = procs.spawn("owner", DeviceOwner)
        buf = list(owner.publish.call(n).get().values())[0]
        host = bytearray(n)
        r = buf.read_into(host).get(timeout=60)
        ok_host = list(host[:5]) == [0, 1, 2, 3, 4] and host[n - 1] == (n - 1) % 251
        dst = te.empty((n,), "uint8", "cuda:1")
        r2 = buf.read_into(dst, offset=0).get(timeout=60)
        back = castmesh.zeros((n,), "uint8")
        s = te.Stream("cuda:1")
        te.copy(back, dst, s)
        s.synchronize()
        ok_device = bytes(memoryview(back)) == bytes(host)
        src = te.empty((10,), "uint8", "cuda:1")
        te.copy(src, array.array("B", [200] * 10), s)
        s.synchronize()
        w = buf.write_from(src, offset=50).get(timeout=60)
        again = bytearray(20)
        buf.read_into(again, offset=45).get(timeout=60)
        print(repr((r.transport, r2.transport, w.transport, ok_host, ok_device, list(again))))
        procs.stop().get()
    """)
    env = dict(os.environ, CASTMESH_BACKEND_PATH=FAKE_DIR,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    read_host, read_device, wrote, ok_host, ok_device, again = eval(done.stdout.strip().splitlines()[-1])
    assert read_host.endswith("+host_staging") and read_device.endswith("+host_staging"), (read_host, read_device)
    assert wrote.endswith("+host_staging"), wrote
    assert ok_host and ok_device
    assert again == [45 % 251, 46, 47, 48, 49] + [200] * 10 + [60, 61, 62, 63, 64]
