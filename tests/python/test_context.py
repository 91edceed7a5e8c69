"""Context, as Monarch documents it: ``context().actor_instance`` (rank,
name, actor id, proc) inside an actor and in the controller,
``current_actor_name()``, ``get_or_spawn_controller(name, Class, *args)``
(one actor in the controller's process, found by name from any actor), and
``this_proc()`` in the controller spawning there."""

from __future__ import annotations

import os

import pytest

from castmesh import (Actor, ActorMesh, Context, Instance, context, current_actor_name, current_rank, endpoint,
                      get_or_spawn_controller, this_host, this_proc)


class Tally(Actor):
    """A controller singleton: counts what every caller adds."""

    def __init__(self, start: int) -> None:
        self.total = start

    @endpoint
    def add(self, n: int) -> int:
        self.total += n
        return self.total

    @endpoint
    def where(self) -> tuple:
        return os.getpid(), current_actor_name()


class Inspector(Actor):
    @endpoint
    def describe(self) -> dict:
        ctx = context()
        me = ctx.actor_instance
        return {
            "is_context": isinstance(ctx, Context) and isinstance(me, Instance),
            "rank": (me.rank.rank, dict(me.rank)),
            "message_rank": dict(ctx.message_rank),
            "current_rank": dict(current_rank()),
            "name": me.name,
            "actor_id": me.actor_id,
            "proc_id": me.proc_id,
            "class_name": me.class_name,
            "current_actor_name": current_actor_name(),
            "pid": os.getpid(),
        }

    @endpoint
    def add_to_tally(self, n: int) -> tuple:
        tally = get_or_spawn_controller("tally", Tally, 100).get(timeout=30)
        return tally.add.call_one(n).get(timeout=30), tally.where.call_one().get(timeout=30)


def _one_mesh(cls: type, name: str, **per_host: int):
    """A module fixture's body: procs shaped by `per_host`, one `cls` on each."""
    with this_host().spawn_procs(per_host=per_host) as procs:
        yield procs.spawn(name, cls)


@pytest.fixture(scope="module")
def inspectors():
    yield from _one_mesh(Inspector, "inspectors", hosts=1, gpus=2)


@pytest.mark.timeout(60)
def test_context_inside_an_actor(inspectors):
    described = list(inspectors.describe.call().get(timeout=30).values())
    for position, d in enumerate(described):
        assert d["is_context"]
        assert d["rank"] == (position, {"hosts": 0, "gpus": position})
        assert d["message_rank"] == d["current_rank"] == {"hosts": 0, "gpus": position}
        assert d["name"] == "inspectors"
        assert d["actor_id"] == d["current_actor_name"]
        assert "inspectors" in d["actor_id"] and d["actor_id"].startswith(d["proc_id"] + "/")
        assert d["class_name"] == f"{Inspector.__module__}.Inspector"
        assert d["pid"] != os.getpid()
    assert described[0]["proc_id"] != described[1]["proc_id"]


@pytest.mark.timeout(30)
def test_context_in_the_controller():
    me = context().actor_instance
    assert me.name == "client" and dict(me.rank) == {} and me.rank.rank == 0
    assert current_actor_name() == me.actor_id == f"{me.proc_id}/client"
    assert me.proc_mesh is None and me.proc is None


@pytest.mark.timeout(60)
def test_get_or_spawn_controller_is_one_actor_for_every_caller(inspectors):
    tally = get_or_spawn_controller("tally", Tally, 100).get(timeout=30)
    assert isinstance(tally, ActorMesh)
    pid, name = tally.where.call_one().get(timeout=30)
    assert pid == os.getpid()  # it lives in the controller's process
    assert tally.add.call_one(1).get(timeout=30) == 101
    # Actors on other procs find the same one by name (the arguments of a
    # later call are not used: it exists).
    results = inspectors.add_to_tally.call(10).get(timeout=30)
    totals = sorted(total for total, _ in results.values())
    assert totals == [111, 121]
    assert {where for _, where in results.values()} == {(pid, name)}
    again = get_or_spawn_controller("tally", Tally, 0).get(timeout=30)
    assert again.add.call_one(0).get(timeout=30) == 121


@pytest.mark.timeout(60)
def test_this_proc_in_the_controller_spawns_there():
    local = this_proc().spawn("local_tally", Tally, 5)
    pid, name = local.where.call_one().get(timeout=30)
    assert pid == os.getpid() and "local_tally" in name
    assert local.add.call_one(1).get(timeout=30) == 6
    local.stop().get(timeout=30)


class MessageRanks(Actor):
    """Says where each message found it: ``context().message_rank`` (the
    point in the slice the message was sent to) next to its own rank."""

    def __init__(self) -> None:
        self.broadcast_rank = None

    @endpoint
    def record(self) -> None:
        self.broadcast_rank = dict(context().message_rank)

    @endpoint
    def where(self) -> tuple:
        message = context().message_rank
        return dict(context().actor_instance.rank), message.rank, dict(message)

    @endpoint
    def recorded(self) -> tuple:
        return dict(context().actor_instance.rank), self.broadcast_rank


@pytest.fixture(scope="module")
def ranked():
    yield from _one_mesh(MessageRanks, "message_ranks", hosts=2, gpus=2)


@pytest.mark.timeout(60)
def test_message_rank_of_a_whole_mesh_call_is_the_actors_rank(ranked):
    for own, rank, message in ranked.where.call().get(timeout=30).values():
        assert message == own and rank == 2 * own["hosts"] + own["gpus"]


@pytest.mark.timeout(60)
def test_message_rank_of_a_broadcast_to_a_slice_is_the_point_in_the_slice(ranked):
    ranked.slice(gpus=1).record.broadcast()
    # Calls from one sender reach each member in order: the broadcast is handled first.
    recorded = dict((tuple(own.items()), seen) for own, seen in ranked.recorded.call().get(timeout=30).values())
    assert recorded == {
        (("hosts", 0), ("gpus", 0)): None,
        (("hosts", 0), ("gpus", 1)): {"hosts": 0},
        (("hosts", 1), ("gpus", 0)): None,
        (("hosts", 1), ("gpus", 1)): {"hosts": 1},
    }


@pytest.mark.timeout(60)
def test_message_rank_of_a_call_to_a_slice(ranked):
    answers = list(ranked.slice(hosts=1).where.call().get(timeout=30).values())
    assert answers == [({"hosts": 1, "gpus": 0}, 0, {"gpus": 0}), ({"hosts": 1, "gpus": 1}, 1, {"gpus": 1})]
    # A range keeps its dimension, numbered from the slice's start; a reversed one counts from its end.
    answers = list(ranked.slice(hosts=slice(1, 2), gpus=slice(None, None, -1)).where.call().get(timeout=30).values())
    assert answers == [({"hosts": 1, "gpus": 1}, 0, {"hosts": 0, "gpus": 0}),
                       ({"hosts": 1, "gpus": 0}, 1, {"hosts": 0, "gpus": 1})]


@pytest.mark.timeout(60)
def test_message_rank_of_a_call_to_one_member_has_no_dimensions(ranked):
    assert ranked.slice(hosts=0, gpus=1).where.call_one().get(timeout=30) == ({"hosts": 0, "gpus": 1}, 0, {})
    own, rank, message = ranked.where.choose().get(timeout=30)
    assert (rank, message) == (0, {}) and set(own) == {"hosts", "gpus"}


@pytest.mark.timeout(60)
def test_message_rank_of_a_slice_passed_to_another_actor(ranked):
    """A slice pickled into an actor still calls as that slice."""
    relay = this_proc().spawn("relay", Relay)
    try:
        answers = relay.call_where.call_one(ranked.slice(gpus=0)).get(timeout=30)
        assert answers == [({"hosts": 0, "gpus": 0}, 0, {"hosts": 0}), ({"hosts": 1, "gpus": 0}, 1, {"hosts": 1})]
    finally:
        relay.stop().get(timeout=30)


class Relay(Actor):
    @endpoint
    def call_where(self, mesh: ActorMesh) -> list:
        return list(mesh.where.call().get(timeout=30).values())
