"""Slicing follows Python's rules everywhere a slice or index is accepted
(Shape, ValueMesh, ActorMesh, ProcMesh): ``mesh.slice(gpus=s)`` keeps the
members ``range(size)[s]``, an index ``i`` (negative from the end) the member
``range(size)[i]``. Checked exhaustively against ``range(n)[s]`` for small n.

A negative step reverses the order, as in Python: ``slice(None, None, -1)``
gives the members last first (the C++ Shape holds ascending orders only; the
Python Shape records the reversed dimensions over it). castmesh's one limit:
a selection that is empty (a mesh with no members cannot be messaged) is a
ValueError.
"""

from __future__ import annotations

import itertools
import os

import pytest

from castmesh import Actor, Shape, ValueMesh, current_rank, endpoint, this_host

BOUNDS = [None] + list(range(-6, 7))
STEPS = [None, 1, 2, 3, 5, -1, -2, -3]


def all_slices():
    for start, stop, step in itertools.product(BOUNDS, BOUNDS, STEPS):
        yield slice(start, stop, step)


def expected(n: int, s: slice):
    """What castmesh must select: range(n)[s], or the error it must raise."""
    picked = list(range(n)[s])
    if not picked:
        return ValueError
    return picked


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_shape_slices_match_range(n):
    shape = Shape({"x": n})
    for s in all_slices():
        want = expected(n, s)
        if want is ValueError:
            with pytest.raises(ValueError):
                shape.select(x=s)
            continue
        got = shape.select(x=s)
        assert got.ranks == want, (n, s)
        assert got.sizes == {"x": len(want)}


@pytest.mark.timeout(60)
def test_shape_slices_of_an_inner_dimension_and_of_a_slice():
    shape = Shape({"hosts": 3, "gpus": 4})
    for s in all_slices():
        want = expected(4, s)
        if want is ValueError:
            with pytest.raises(ValueError):
                shape.select(gpus=s)
            continue
        got = shape.select(gpus=s)
        assert got.ranks == [h * 4 + g for h in range(3) for g in want], s
    # A slice of a slice indexes the slice, not the base mesh.
    odd = shape.select(gpus=slice(1, None, 2))  # gpus 1, 3
    assert odd.select(gpus=-1).ranks == [3, 7, 11]
    assert odd.select(hosts=slice(-2, None), gpus=slice(0, -1)).ranks == [5, 9]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_shape_indices_match_range(n):
    shape = Shape({"x": n, "y": 2})
    for i in range(-n - 3, n + 3):
        if -n <= i < n:
            got = shape.select(x=i)
            assert got.labels == ["y"]
            assert got.ranks == [range(n)[i] * 2, range(n)[i] * 2 + 1]
        else:
            with pytest.raises(IndexError):
                shape.select(x=i)


def test_range_objects_are_slices():
    shape = Shape({"x": 6})
    assert shape.select(x=range(1, 5, 2)).ranks == [1, 3]
    assert shape.select(x=range(-3, 6)).ranks == [3, 4, 5]


def test_bad_selectors_are_clear_errors():
    shape = Shape({"gpus": 4})
    with pytest.raises(KeyError, match="gpu"):
        shape.select(gpu=0)
    with pytest.raises(TypeError):
        shape.select(gpus=True)
    with pytest.raises(TypeError):
        shape.select(gpus="1")
    with pytest.raises(ValueError, match="step"):
        shape.select(gpus=slice(None, None, 0))
    assert shape.select(gpus=slice(None, None, -1)).ranks == [3, 2, 1, 0]
    assert shape.select(gpus=slice(3, 0, -2)).ranks == [3, 1]
    assert shape.select(gpus=range(3, 0, -2)).ranks == [3, 1]  # a range is read as a slice
    with pytest.raises(ValueError, match="nothing"):
        shape.select(gpus=slice(2, 2))
    with pytest.raises(IndexError, match="out of range"):
        shape.select(gpus=-5)
    # A huge step selects the first index only; a huge bound is clamped.
    assert shape.select(gpus=slice(1, 10**30, 10**30)).ranks == [1]
    assert shape.select(gpus=slice(-10**30, 10**30)).ranks == [0, 1, 2, 3]


SOME = [slice(None, None, -1), slice(3, 0, -2), slice(-1, None, -3), slice(1, None), slice(None, None, 2), 2, -1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_slices_of_slices_match_range(n):
    """A selection of a (possibly reversed) selection indexes the first one,
    exactly as Python's range(n)[s1][s2] does."""
    shape = Shape({"x": n, "y": 2})
    for first in SOME:
        try:
            outer = range(n)[first]
        except IndexError:
            continue
        if isinstance(outer, int):
            continue
        if not outer:
            continue
        sub = shape.select(x=first)
        assert sub.ranks == [x * 2 + y for x in outer for y in range(2)], first
        assert [p["x"] for p in sub.points()] == [i for i in range(len(outer)) for _ in range(2)]
        assert [p.base_rank for p in sub.points()] == sub.ranks
        for second in all_slices():
            inner = list(outer[second])
            if not inner:
                with pytest.raises(ValueError):
                    sub.select(x=second)
                continue
            got = sub.select(x=second)
            assert got.ranks == [x * 2 + y for x in inner for y in range(2)], (first, second)
            assert got.sizes == {"x": len(inner), "y": 2}
        for i in range(-len(outer), len(outer)):
            assert sub.select(x=i).ranks == [outer[i] * 2, outer[i] * 2 + 1]


def test_reversed_shapes_reshape_pickle_and_compare():
    import pickle

    shape = Shape({"hosts": 2, "gpus": 3})
    both = shape.select(hosts=slice(None, None, -1), gpus=slice(None, None, -1))
    assert both.ranks == [5, 4, 3, 2, 1, 0]
    assert both.reversed_dims == ["hosts", "gpus"]
    assert both.flatten("all").ranks == [5, 4, 3, 2, 1, 0]
    assert both.rename(gpus="tp").ranks == both.ranks and both.rename(gpus="tp").labels == ["hosts", "tp"]
    inner = shape.select(gpus=slice(None, None, -1))
    assert inner.ranks == [2, 1, 0, 5, 4, 3]
    with pytest.raises(ValueError, match="reversed along"):
        inner.flatten("all")  # no strided run of ranks is 2, 1, 0, 5, 4, 3
    six = Shape({"x": 6}).select(x=slice(None, None, -1))
    assert six.split(x=("a", "b"), b=3).ranks == [5, 4, 3, 2, 1, 0]
    assert six.split(x=("a", "b"), b=3).select(a=0).ranks == [5, 4, 3]
    assert pickle.loads(pickle.dumps(inner)) == inner
    assert inner != shape.select(gpus=slice(None, None, 1))
    assert inner.select(gpus=slice(None, None, -1)) == shape
    assert "reversed" in repr(inner)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 3, 4])
def test_value_mesh_slices_and_indices_match_range(n):
    vm = ValueMesh(Shape({"x": n}), [f"v{i}" for i in range(n)])
    for s in all_slices():
        want = expected(n, s)
        if want is ValueError:
            with pytest.raises(ValueError):
                vm.slice(x=s)
            continue
        assert list(vm.slice(x=s).values()) == [f"v{i}" for i in want], s
    for i in range(-n - 2, n + 2):
        if -n <= i < n:
            assert vm[i] == f"v{range(n)[i]}"
            assert vm.item(x=i) == f"v{range(n)[i]}"
            assert vm[{"x": i}] == f"v{range(n)[i]}"
            assert list(vm.slice(x=i).values()) == [f"v{range(n)[i]}"]
        else:
            with pytest.raises(IndexError):
                vm[i]
            with pytest.raises(IndexError):
                vm.item(x=i)


def test_value_mesh_slice_of_a_two_dimensional_mesh():
    vm = ValueMesh(Shape({"hosts": 2, "gpus": 3}), list(range(6)))
    assert list(vm.slice(gpus=-1).values()) == [2, 5]
    sub = vm.slice(hosts=slice(-1, None), gpus=slice(0, -1))
    assert sub.shape.sizes == {"hosts": 1, "gpus": 2}
    assert list(sub.values()) == [3, 4]
    assert sub.item(hosts=0, gpus=-1) == 4


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        point = current_rank()
        return (point.base_rank, os.getpid())

    @endpoint
    def position(self) -> int:
        return current_rank().rank

    @endpoint(explicit_response_port=True)
    def later(self, port) -> None:
        port.send(current_rank().base_rank)


@pytest.fixture(scope="module")
def procs():
    with this_host().spawn_procs(per_host={"gpus": 4}) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def where(procs):
    mesh = procs.spawn("where", Where)
    yield mesh
    mesh.stop()


@pytest.mark.timeout(120)
def test_actor_mesh_slices_reach_exactly_range_of_the_slice(where):
    # The example: a negative stop drops the last actor.
    assert [r for r, _ in where.slice(gpus=slice(0, -1)).where.call().get(timeout=30).values()] == [0, 1, 2]
    assert [r for r, _ in where.slice(gpus=slice(-2, None)).where.call().get(timeout=30).values()] == [2, 3]
    for s in all_slices():
        want = expected(4, s)
        if want is ValueError:
            with pytest.raises(ValueError):
                where.slice(gpus=s)
            continue
        sub = where.slice(gpus=s)
        assert sub.shape.ranks == want, s
        got = [rank for rank, _ in sub.where.call().get(timeout=30).values()]
        assert got == want, s


@pytest.mark.timeout(60)
def test_actor_mesh_indices_and_every_adverb_on_a_negative_slice(where):
    for i in range(-4, 4):
        assert where.slice(gpus=i).where.call_one().get(timeout=30)[0] == range(4)[i]
    for i in (-5, 4):
        with pytest.raises(IndexError):
            where.slice(gpus=i)
    tail = where.slice(gpus=slice(-3, None, 2))  # gpus 1, 3
    assert sorted(r for r, _ in tail.where.stream(timeout=30).values()) == [1, 3]
    assert tail.where.choose().get(timeout=30)[0] in (1, 3)
    tail.where.broadcast()


@pytest.mark.timeout(120)
def test_proc_mesh_slices_follow_range_and_spawn_there(procs):
    pids = procs.pids
    for s in all_slices():
        want = expected(4, s)
        if want is ValueError:
            with pytest.raises(ValueError):
                procs.slice(gpus=s)
            continue
        assert procs.slice(gpus=s).pids == [pids[i] for i in want], s
    assert procs.slice(gpus=-1).pids == [pids[3]]
    part = procs.slice(gpus=slice(1, -1))
    assert part.shape.sizes == {"gpus": 2}
    mesh = part.spawn("on_part", Where)
    try:
        got = list(mesh.where.call().get(timeout=30).values())
        assert [pid for _, pid in got] == [pids[1], pids[2]]
        assert [rank for rank, _ in got] == [0, 1]  # the new mesh numbers its members 0..n-1
        assert mesh.slice(gpus=-1).where.call_one().get(timeout=30)[1] == pids[2]
    finally:
        mesh.stop()
    with pytest.raises(ValueError, match="whole proc mesh"):
        part.stop()


@pytest.mark.timeout(120)
def test_reversed_actor_mesh_every_adverb_in_reversed_order(where):
    back = where.slice(gpus=slice(None, None, -1))
    assert [r for r, _ in back.where.call().get(timeout=30).values()] == [3, 2, 1, 0]
    assert list(back.later.call().get(timeout=30).values()) == [3, 2, 1, 0]
    assert sorted(f.get(timeout=30)[0] for f in back.where.stream()) == [0, 1, 2, 3]
    assert back.slice(gpus=0).where.call_one().get(timeout=30)[0] == 3
    assert back.slice(gpus=slice(1, 3)).where.call().get(timeout=30).shape.ranks == [2, 1]
    assert [r for r, _ in back.slice(gpus=slice(None, None, -2)).where.call().get(timeout=30).values()] == [0, 2]
    assert {back.where.choose().get(timeout=30)[0] for _ in range(4)} == {0, 1, 2, 3}
    back.where.broadcast()
    import castmesh

    assert castmesh.Accumulator(back.position, 0, max).accumulate().get(timeout=30) == 3


@pytest.mark.timeout(120)
def test_spawn_on_a_reversed_proc_mesh(procs):
    pids = procs.pids
    back = procs.slice(gpus=slice(3, 0, -2))  # procs 3, 1
    assert back.pids == [pids[3], pids[1]]
    mesh = back.spawn("on_reversed", Where)
    try:
        got = list(mesh.where.call().get(timeout=30).values())
        assert [pid for _, pid in got] == [pids[3], pids[1]]
        assert list(mesh.position.call().get(timeout=30).values()) == [0, 1]  # points in the slice's order
        assert mesh.slice(gpus=0).where.call_one().get(timeout=30)[1] == pids[3]
        assert sorted(pid for _, pid in mesh.where.stream().values()) == sorted([pids[3], pids[1]])
    finally:
        mesh.stop().get(timeout=30)


class Spawner(Actor):
    """Gets a proc mesh in a message, slices it and spawns on the slice."""

    @endpoint
    def spawn_on(self, procs, sel) -> list:
        mesh = procs.slice(gpus=sel).spawn("grandchildren", Where)
        try:
            return [pid for _, pid in mesh.where.call().get(timeout=30).values()]
        finally:
            mesh.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_a_reversed_proc_mesh_passed_to_an_actor_keeps_its_order(procs):
    pids = procs.pids
    spawner = procs.slice(gpus=0).spawn("spawner", Spawner)
    try:
        back = procs.slice(gpus=slice(None, None, -1))
        assert spawner.spawn_on.call_one(back, slice(0, 3)).get(timeout=60) == [pids[3], pids[2], pids[1]]
        assert spawner.spawn_on.call_one(back, slice(None, None, -2)).get(timeout=60) == [pids[0], pids[2]]
    finally:
        spawner.stop().get(timeout=30)
