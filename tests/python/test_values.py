"""Shape, Point and ValueMesh (no procs needed)."""

import pickle

import pytest

from castmesh import Point, Shape, ValueMesh


def test_shape_select_by_name():
    shape = Shape({"hosts": 2, "gpus": 4})
    assert len(shape) == 8 and shape.labels == ["hosts", "gpus"]
    one = shape.select(gpus=1)
    assert one.labels == ["hosts"] and one.ranks == [1, 5]
    kept = shape.select(gpus=slice(0, 4, 2))
    assert kept.sizes == {"hosts": 2, "gpus": 2} and kept.ranks == [0, 2, 4, 6]
    assert shape.select(hosts=1, gpus=3).ranks == [7]
    with pytest.raises((KeyError, ValueError), match="nodes"):
        shape.select(nodes=0)
    with pytest.raises(IndexError):  # as Python (and Monarch) index out of range
        shape.select(gpus=4)
    with pytest.raises(TypeError):
        shape.select(gpus="0")


def test_shape_pickles_with_its_slice():
    kept = Shape({"hosts": 2, "gpus": 4}).select(gpus=slice(1, 4, 2))
    again = pickle.loads(pickle.dumps(kept))
    assert again == kept and again.ranks == [1, 3, 5, 7]


def test_value_mesh_indexing():
    shape = Shape({"x": 2, "y": 2})
    vm = ValueMesh(shape, ["a", "b", "c", "d"])
    assert vm[{"x": 1, "y": 0}] == "c"
    assert vm[Point(0, {"x": 0, "y": 1})] == "b"
    assert vm[3] == "d"
    assert vm.item(x=0, y=0) == "a"
    assert list(vm.values()) == ["a", "b", "c", "d"]
    assert [(p.rank, dict(p)) for p, _ in vm.items()][2] == (2, {"x": 1, "y": 0})
    assert pickle.loads(pickle.dumps(vm)) == vm
    with pytest.raises(KeyError):
        vm[{"x": 0}]
    with pytest.raises(IndexError):
        vm[{"x": 2, "y": 0}]
    with pytest.raises(ValueError):
        ValueMesh(shape, [1])
    with pytest.raises(ValueError):
        vm.item()
