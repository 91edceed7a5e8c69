"""Ports and channels, as Monarch documents them: ``Channel.open()`` gives
``(Port, PortReceiver)``; a Port pickles into any message and any actor can
``port.send(value)``; ``await receiver.recv()`` / ``.recv().get()``;
``@endpoint(explicit_response_port=True)`` handlers answer (now or later)
through the port they are given; ``send(endpoint, args, kwargs, port=...)``
sends each actor's result to a port."""

from __future__ import annotations

import asyncio
import pickle

import pytest

import castmesh
from castmesh import Actor, ActorError, Channel, Port, PortReceiver, current_rank, endpoint, send, this_host


class Relay(Actor):
    def __init__(self) -> None:
        self.waiting = []

    @endpoint
    def push(self, where: dict, values: list) -> None:
        for value in values:
            where["port"].send(value)

    @endpoint
    def push_error(self, port: Port) -> None:
        port.exception(KeyError("no such thing"))

    @endpoint
    def square(self, x: int) -> int:
        return x * x + current_rank().rank

    @endpoint
    def fail(self) -> None:
        raise ValueError("refused")

    @endpoint(explicit_response_port=True)
    def later(self, port: Port, tag: str) -> None:
        self.waiting.append((port, tag))

    @endpoint
    def answer(self) -> int:
        waiting, self.waiting = self.waiting, []
        for port, tag in waiting:
            port.send(f"{tag}@{current_rank().rank}")
        return len(waiting)

    @endpoint(explicit_response_port=True)
    def at_once(self, port: Port, x: int) -> str:
        port.send(x + current_rank().rank)
        return "ignored"

    @endpoint(explicit_response_port=True)
    async def broken(self, port: Port) -> None:
        raise RuntimeError("cannot answer")

    @endpoint
    def listen_and_forward(self, other: "castmesh.ActorMesh[Relay]") -> list:
        # A channel opened inside an actor; another actor sends to it.
        port, receiver = Channel.open()
        other.push.call_one({"port": port}, ["x", "y"]).get(timeout=30)
        return [receiver.recv().get(timeout=30), receiver.recv().get(timeout=30)]


@pytest.fixture(scope="module")
def relays():
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        mesh = procs.spawn("relays", Relay)
        yield mesh


@pytest.mark.timeout(60)
def test_port_travels_in_a_message_and_values_arrive_in_order(relays):
    port, receiver = Channel.open()
    assert isinstance(port, Port) and isinstance(receiver, PortReceiver)
    relays.slice(gpus=1).push.call_one({"port": port}, [1, "two", [3]]).get(timeout=30)
    assert [receiver.recv().get(timeout=30) for _ in range(3)] == [1, "two", [3]]
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.2)


@pytest.mark.timeout(60)
def test_recv_can_be_awaited_and_each_recv_gets_its_own_message(relays):
    port, receiver = Channel.open()

    async def main() -> list:
        first, second = receiver.recv(), receiver.recv()
        relays.slice(gpus=0).push.broadcast({"port": port}, ["a", "b"])
        return [await first, await second]

    assert asyncio.run(main()) == ["a", "b"]


@pytest.mark.timeout(60)
def test_port_exception_is_raised_by_recv_and_ports_pickle(relays):
    port, receiver = Channel.open()
    again = pickle.loads(pickle.dumps([port]))[0]
    assert again.address == port.address
    relays.slice(gpus=0).push_error.call_one(again).get(timeout=30)
    with pytest.raises(KeyError, match="no such thing"):
        receiver.recv().get(timeout=30)
    port.send("from the controller too")
    assert receiver.recv().get(timeout=30) == "from the controller too"


@pytest.mark.timeout(60)
def test_explicit_response_port_answers_later(relays):
    one = relays.slice(gpus=1)
    pending = one.later.call_one("t1")
    with pytest.raises(TimeoutError):
        pending.get(timeout=0.3)  # the handler has returned but not answered
    assert one.answer.call_one().get(timeout=30) == 1
    assert pending.get(timeout=30) == "t1@1"
    # A whole-mesh call gets one answer per actor, in mesh order.
    both = relays.later.call("t2")
    assert list(relays.answer.call().get(timeout=30).values()) == [1, 1]
    assert list(both.get(timeout=30).values()) == ["t2@0", "t2@1"]


@pytest.mark.timeout(60)
def test_explicit_response_port_with_every_adverb(relays):
    assert list(relays.at_once.call(10).get(timeout=30).values()) == [10, 11]  # not the return value
    assert relays.slice(gpus=-1).at_once.call_one(5).get(timeout=30) == 6
    assert sorted(relays.at_once.stream(1, timeout=30).values()) == [1, 2]
    assert relays.at_once.choose(0).get(timeout=30) in (0, 1)
    relays.at_once.broadcast(7)  # nobody waits: the answers are dropped
    with pytest.raises(ActorError, match="cannot answer"):
        relays.slice(gpus=0).broken.call_one().get(timeout=30)


@pytest.mark.timeout(60)
def test_send_with_a_port_collects_every_result(relays):
    port, receiver = Channel.open()
    send(relays.square, (3,), {}, port=port)
    got = sorted(receiver.recv_ranked().get(timeout=30) for _ in range(2))
    assert got == [(0, 9), (1, 10)]
    send(relays.fail, (), {}, port=port)
    for _ in range(2):
        with pytest.raises(ValueError, match="refused"):
            receiver.recv().get(timeout=30)
    send(relays.square, (1,), {})  # no port: fire and forget
    with pytest.raises(ValueError, match="selection"):
        send(relays.square, (1,), {}, selection="some")


@pytest.mark.timeout(60)
def test_open_ranked_receives_ranks_and_values(relays):
    port, receiver = Channel.open_ranked()
    send(relays.square, (2,), {}, port=port)
    assert sorted(receiver.recv().get(timeout=30) for _ in range(2)) == [(0, 4), (1, 5)]
    port.send("from the controller")
    assert receiver.recv().get(timeout=30) == (None, "from the controller")


@pytest.mark.timeout(60)
def test_send_with_selection_choose_reaches_one_actor(relays):
    port, receiver = Channel.open()
    send(relays.square, (3,), {}, port=port, selection="choose")
    send(relays.square, (3,), {}, port=port, selection="choose")  # round-robin: the other one
    send(relays.square, (5,), {}, port=port)  # then every actor
    got = [receiver.recv_ranked().get(timeout=30) for _ in range(4)]
    # Each actor answers in the order it was sent to: one "choose" each, then the broadcast.
    by_rank = {rank: [value for r, value in got if r == rank] for rank in (0, 1)}
    assert by_rank == {0: [9, 25], 1: [10, 26]}, got


@pytest.mark.timeout(60)
def test_a_channel_opened_inside_an_actor(relays):
    assert relays.slice(gpus=0).listen_and_forward.call_one(relays.slice(gpus=1)).get(timeout=30) == ["x", "y"]


class Plain(Actor):
    def double(self, x: int) -> int:  # not an endpoint
        return 2 * x + current_rank().rank

    def answer_through(self, port: Port, x: int) -> None:
        port.send(-x)


@pytest.mark.timeout(60)
def test_as_endpoint_makes_a_plain_method_callable(relays):
    procs = relays._proc_mesh
    plain = procs.spawn("plain", Plain)
    with pytest.raises(AttributeError, match="as_endpoint"):
        plain.double.call(1)
    double = castmesh.as_endpoint(plain.double)
    assert isinstance(double, castmesh.Endpoint)
    assert list(double.call(5).get(timeout=30).values()) == [10, 11]
    assert castmesh.as_endpoint(plain.slice(gpus=1).double).call_one(1).get(timeout=30) == 3
    answer = castmesh.as_endpoint(plain.answer_through, explicit_response_port=True)
    assert list(answer.call(4).get(timeout=30).values()) == [-4, -4]
    assert answer.choose(1).get(timeout=30) == -1
    with pytest.raises(ValueError):
        castmesh.as_endpoint(relays.square)  # already an endpoint
    plain.stop().get(timeout=30)
