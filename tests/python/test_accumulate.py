"""Accumulator (Monarch's): a known reducer (operator.add, min, max) is folded
by the C++ cast relays on the way up the tree; any other function is folded
in the caller. Both paths give the same values; the C++ path is seen at work
through each proc's fold counter (castmesh._castmesh.piece_folds), which
counts the numeric folds that proc did: folding n numbers takes exactly n-1,
wherever they happen.
"""

from __future__ import annotations

import operator

import pytest

import castmesh
from castmesh import Accumulator, Actor, ActorError, _castmesh, current_rank, endpoint, this_host


class Values(Actor):
    @endpoint
    def value(self, scale=1):
        return (current_rank().rank + 1) * scale

    @endpoint
    def mixed(self):
        rank = current_rank().rank
        return rank + 0.5 if rank % 2 else rank

    @endpoint
    def text(self):
        return "abcd"[current_rank().rank] * 2

    @endpoint
    def big(self):
        return 2**62 + current_rank().rank

    @endpoint
    def flag(self):
        return current_rank().rank % 2 == 0

    @endpoint
    def fail_on(self, rank):
        if current_rank().rank == rank:
            raise ValueError(f"member {rank} fails")
        return 1

    @endpoint
    def folds(self):
        return _castmesh.piece_folds()


@pytest.fixture(autouse=True)
def faults(monkeypatch):
    seen = []
    monkeypatch.setattr(castmesh, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture(scope="module")
def values():
    with this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}) as procs:
        mesh = procs.spawn("values", Values)
        yield mesh
        mesh.stop().get(timeout=30)


def total_folds(mesh) -> int:
    """Numeric folds done so far by every proc of `mesh` and by this one."""
    return sum(mesh.folds.call().get(timeout=30).values()) + _castmesh.piece_folds()


def in_caller(fn):
    """The same function, not recognisable as a known reducer."""
    return lambda acc, v: fn(acc, v)


@pytest.mark.timeout(120)
def test_known_reducers_fold_in_cpp_exactly_once_per_pair(values):
    for combine, name, identity, want in [(operator.add, "sum", 0, 10), (min, "min", 100, 1), (max, "max", -1, 4)]:
        acc = Accumulator(values.value, identity, combine)
        assert acc.reducer == name
        before = total_folds(values)
        assert acc.accumulate().get(timeout=30) == want
        assert total_folds(values) - before == 3, name  # 4 numbers: 3 folds, all in C++
    half = values.slice(gpus=1)
    before = total_folds(values)
    assert Accumulator(half.value, 0, operator.add).accumulate(scale=10).get(timeout=30) == 20 + 40
    assert total_folds(values) - before == 1


@pytest.mark.timeout(120)
def test_other_functions_fold_in_the_caller(values):
    acc = Accumulator(values.value, 0, in_caller(operator.add))
    assert acc.reducer is None
    before = total_folds(values)
    assert acc.accumulate(scale=2).get(timeout=30) == 20
    assert total_folds(values) == before


# (String concatenation is left out: it depends on the order, which neither
# path fixes.)
CASES = [(name, combine) for name in ("value", "mixed", "text", "big", "flag") for combine in (operator.add, min, max)
         if not (name == "text" and combine is operator.add)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("endpoint_name,combine", CASES)
def test_both_paths_give_the_same_values(values, endpoint_name, combine):
    ep = getattr(values, endpoint_name)
    results = list(ep.call().get(timeout=30).values())
    identity = results[0]  # of the endpoint's type (str for text)
    expected = identity
    for r in results:
        expected = combine(expected, r)
    in_tree = Accumulator(ep, identity, combine)
    assert in_tree.reducer is not None
    assert in_tree.accumulate().get(timeout=30) == expected
    assert Accumulator(ep, identity, in_caller(combine)).accumulate().get(timeout=30) == expected


@pytest.mark.timeout(120)
def test_values_cpp_cannot_fold_exactly_reach_the_caller(values):
    # 4 * 2**62 overflows int64: the caller adds those values as Python ints.
    before = total_folds(values)
    assert Accumulator(values.big, 0, operator.add).accumulate().get(timeout=30) == 4 * 2**62 + 6
    # int with float, and bools, are not folded in C++ either (Python's own rules apply).
    assert Accumulator(values.mixed, 0, operator.add).accumulate().get(timeout=30) == 0 + 1.5 + 2 + 3.5
    assert Accumulator(values.flag, 0, operator.add).accumulate().get(timeout=30) == 2
    assert total_folds(values) - before <= 2  # at most the two int pairs of mixed()


@pytest.mark.timeout(120)
def test_an_error_of_one_member_fails_both_paths(values):
    for combine in (operator.add, in_caller(operator.add)):
        with pytest.raises(ActorError, match="member 2 fails"):
            Accumulator(values.fail_on, 0, combine).accumulate(2).get(timeout=30)
    assert Accumulator(values.fail_on, 0, operator.add).accumulate(-1).get(timeout=30) == 4
