"""Meshes and values, as Monarch documents them: flatten, rename, split,
size, sizes and extent on ActorMesh, ProcMesh and ValueMesh;
ValueMesh.slice/get; ProcMesh.shape; a ProcMesh (or ActorMesh) pickled into
an actor, which can then spawn on it."""

from __future__ import annotations

import os
import pickle

import pytest

import castmesh
from castmesh import (Actor, MeshFailure, ProcMesh, Shape, SupervisionError, ValueMesh, context, current_rank,
                      endpoint, this_host)
from castmesh.shape import Extent


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        point = current_rank()
        return dict(point), os.getpid()

    @endpoint
    def die(self) -> None:
        raise SystemExit(9)


class Spawner(Actor):
    """Gets a proc mesh in a message and spawns on it."""

    def __init__(self) -> None:
        self.failures = []
        self.children = None

    @endpoint
    def spawn_on(self, procs: ProcMesh, gpus: int) -> list:
        self.children = procs.slice(gpus=gpus).spawn("grandchildren", Where)
        return [pid for _, pid in self.children.where.call().get(timeout=30).values()]

    @endpoint
    def kill_children(self) -> None:
        try:
            self.children.die.call().get(timeout=30)
        except (castmesh.ActorError, SupervisionError):
            pass

    @endpoint
    def failures_seen(self) -> list:
        return [dict(f.point) for f in self.failures]

    @endpoint
    def own_proc_mesh(self) -> tuple:
        me = context().actor_instance
        proc = me.proc
        return (me.proc_mesh.shape.sizes, proc.shape.sizes, len(proc),
                [pid for _, pid in proc.spawn("beside_me", Where).where.call().get(timeout=30).values()],
                os.getpid())

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True


def test_shape_flatten_rename_split_size_extent():
    shape = Shape({"hosts": 2, "gpus": 4})
    flat = shape.flatten("all")
    assert flat.sizes == {"all": 8} and flat.ranks == list(range(8))
    renamed = shape.rename(hosts="dp", gpus="tp")
    assert renamed.sizes == {"dp": 2, "tp": 4} and renamed.ranks == shape.ranks
    split = shape.split(hosts=("dp", "pp"), gpus=("tp", "cp"), pp=2, cp=2)
    assert split.sizes == {"dp": 1, "pp": 2, "tp": 2, "cp": 2} and split.ranks == shape.ranks
    assert shape.split(gpus=("a", "b"), a=4).sizes == {"hosts": 2, "a": 4, "b": 1}
    assert shape.size() == 8 and shape.size("gpus") == 4 and shape.size(["hosts", "gpus"]) == 8
    extent = shape.extent
    assert isinstance(extent, Extent) and dict(extent) == {"hosts": 2, "gpus": 4}
    assert extent.labels == ["hosts", "gpus"] and extent.sizes == [2, 4] and extent.nelements == 8
    # Errors name the problem.
    with pytest.raises(KeyError):
        shape.size("nodes")
    with pytest.raises(ValueError, match="not divisible"):
        shape.split(gpus=("a", "b"), a=3)
    with pytest.raises(ValueError, match="infer"):
        shape.split(gpus=("a", "b"))
    with pytest.raises(ValueError, match="sequence"):
        shape.split(gpus="tp")
    with pytest.raises(ValueError, match="no split"):
        shape.split(cp=2)
    with pytest.raises(ValueError, match="nodes"):
        shape.rename(nodes="x")
    # A strided view flattens when its ranks allow it, and says so when not.
    assert shape.select(hosts=1).flatten("g").ranks == [4, 5, 6, 7]
    assert shape.select(gpus=slice(0, 4, 2)).flatten("all").ranks == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="without copying"):
        shape.select(gpus=slice(0, 3)).flatten("all")  # ranks 0 1 2 4 5 6: no one stride


def test_value_mesh_shape_ops_slice_and_get():
    vm = ValueMesh(Shape({"hosts": 2, "gpus": 2}), ["a", "b", "c", "d"])
    assert vm.size() == 4 and vm.size("gpus") == 2 and vm.sizes == {"hosts": 2, "gpus": 2}
    assert dict(vm.extent) == {"hosts": 2, "gpus": 2}
    flat = vm.flatten("rank")
    assert [(dict(p), v) for p, v in flat.items()] == [({"rank": i}, v) for i, v in enumerate("abcd")]
    assert vm.rename(gpus="tp").item(hosts=1, tp=0) == "c"
    assert vm.split(hosts=("a", "b"), a=1).item(a=0, b=1, gpus=1) == "d"
    assert vm.get(2) == "c" and vm.get(-1) == "d"
    assert list(vm.slice(gpus=1).values()) == ["b", "d"]
    assert pickle.loads(pickle.dumps(vm.flatten("r"))) == vm.flatten("r")


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}) as mesh:
        yield mesh



@pytest.mark.timeout(60)
def test_actor_mesh_flatten_rename_split(procs, faults):
    mesh = procs.spawn("where", Where)
    assert mesh.size() == 4 and mesh.size("gpus") == 2 and mesh.sizes == {"hosts": 2, "gpus": 2}
    assert dict(mesh.extent) == {"hosts": 2, "gpus": 2}
    pids = procs.pids
    flat = mesh.flatten("all")
    values = flat.where.call().get(timeout=30)
    assert values.sizes == {"all": 4}
    assert [pid for _, pid in values.values()] == pids
    assert flat.slice(all=-1).where.call_one().get(timeout=30)[1] == pids[3]
    renamed = mesh.rename(hosts="dp", gpus="tp")
    assert renamed.slice(dp=1, tp=0).where.call_one().get(timeout=30)[1] == pids[2]
    renamed.where.broadcast()
    split = mesh.split(hosts=("a", "b"), a=1)
    assert split.sizes == {"a": 1, "b": 2, "gpus": 2}
    assert [pid for _, pid in split.slice(b=1).where.call().get(timeout=30).values()] == pids[2:]
    assert sorted(pid for _, pid in renamed.where.stream(timeout=30).values()) == sorted(pids)
    mesh.stop().get(timeout=30)
    assert faults == []


@pytest.mark.timeout(60)
def test_proc_mesh_shape_ops_and_spawn_on_a_reshaped_mesh(procs, faults):
    assert procs.shape == Shape({"hosts": 2, "gpus": 2})
    assert procs.size() == 4 and procs.sizes == {"hosts": 2, "gpus": 2} and dict(procs.extent) == procs.sizes
    flat = procs.flatten("all")
    assert flat.shape.sizes == {"all": 4} and flat.pids == procs.pids
    mesh = flat.spawn("flat_where", Where)
    assert [coords for coords, _ in mesh.where.call().get(timeout=30).values()] == [{"all": i} for i in range(4)]
    mesh.stop().get(timeout=30)
    renamed = procs.slice(hosts=1).rename(gpus="tp")
    assert renamed.shape.sizes == {"tp": 2} and renamed.pids == procs.pids[2:]
    mesh = renamed.spawn("renamed_where", Where)
    assert [pid for _, pid in mesh.where.call().get(timeout=30).values()] == procs.pids[2:]
    mesh.stop().get(timeout=30)
    with pytest.raises(ValueError, match="slice it before"):
        renamed.slice(tp=0)
    assert faults == []


@pytest.mark.timeout(90)
def test_proc_mesh_pickled_into_an_actor_which_spawns_and_supervises(procs, faults):
    spawner = procs.slice(hosts=0, gpus=0).spawn("spawner", Spawner)
    pids = spawner.spawn_on.call_one(procs.slice(hosts=1), -1).get(timeout=30)
    assert pids == [procs.pids[3]]
    spawner.kill_children.call_one().get(timeout=30)
    seen = []
    deadline = __import__("time").monotonic() + 30
    while not seen and __import__("time").monotonic() < deadline:
        seen = spawner.failures_seen.call_one().get(timeout=30)
    assert seen == [{}]  # the one grandchild (a point of no dimensions), told to the spawner, which handled it
    assert faults == []
    spawner.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_context_proc_mesh_and_proc_inside_an_actor(procs, faults):
    mesh = procs.spawn("own_procs", Spawner)
    mesh_sizes, proc_sizes, count, beside, pid = mesh.slice(hosts=1, gpus=0).own_proc_mesh.call_one().get(timeout=60)
    assert mesh_sizes == {"hosts": 2, "gpus": 2}
    assert proc_sizes == {} and count == 1
    assert beside == [pid] == [procs.pids[2]]  # spawned on its own proc
    mesh.stop().get(timeout=30)
    assert faults == []


@pytest.mark.timeout(60)
def test_pickled_proc_mesh_comes_back_as_the_live_one(procs):
    again = pickle.loads(pickle.dumps(procs.slice(gpus=1)))
    assert again.pids == [procs.pids[1], procs.pids[3]]
    with pytest.raises(ValueError, match="whole proc mesh"):
        again.stop()


class Number(Actor):
    @endpoint
    def value(self, scale: int = 1) -> int:
        return (current_rank().rank + 1) * scale


@pytest.mark.timeout(60)
def test_accumulator_folds_every_result_and_endpoint_is_endpointref(procs, faults):
    assert castmesh.Endpoint is castmesh.EndpointRef
    mesh = procs.spawn("numbers", Number)
    assert isinstance(mesh.value, castmesh.Endpoint)
    total = castmesh.Accumulator(mesh.value, 0, lambda acc, v: acc + v)
    assert total.accumulate().get(timeout=30) == 1 + 2 + 3 + 4
    assert total.accumulate(scale=10).get(timeout=30) == 100
    future = mesh.slice(hosts=1, gpus=1).value.call_one()
    assert future.result(timeout=30) == 4 and future.exception() is None and future.done()
    assert isinstance(this_host(), castmesh.HostMesh)
    seen = castmesh.Accumulator(mesh.slice(gpus=0).value, [], lambda acc, v: sorted(acc + [v]))
    assert seen.accumulate().get(timeout=30) == [1, 3]
    mesh.stop().get(timeout=30)
