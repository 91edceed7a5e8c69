"""The status code of a C++ error reaches Python as ``.code`` (one
translation, python/src/status_binding.h): on castmesh's own exceptions and
on the builtin ones raised for some codes; nothing parses message text."""

import pickle

import pytest

import castmesh
from castmesh import Actor, CastmeshError, ProcError, _castmesh, endpoint, this_proc
from castmesh.collectives import CommunicatorError


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value


def test_builtin_exceptions_carry_the_code():
    with pytest.raises(RuntimeError) as backend:
        castmesh.load_backend("not_a_backend")
    assert backend.value.code == "NOT_FOUND"
    assert not str(backend.value).startswith("NOT_FOUND")  # the code is not in the text
    with pytest.raises(KeyError) as shape:
        _castmesh.Shape([("gpus", 2)]).select_index("hosts", 0)
    assert shape.value.code == "NOT_FOUND"
    with pytest.raises(ValueError) as address:
        _castmesh.ActorRef.from_address("not an address")
    assert address.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ValueError) as tensor:
        castmesh.zeros((2, -1))
    assert tensor.value.code == "INVALID_ARGUMENT"
    with pytest.raises(MemoryError) as memory:
        castmesh.zeros(1 << 62, "int8")
    assert memory.value.code == "RESOURCE_EXHAUSTED"


def test_castmesh_errors_carry_the_code_and_pickle_with_it():
    with pytest.raises(CommunicatorError) as raised:
        castmesh.collectives.current()
    assert raised.value.code == "FAILED_PRECONDITION" and isinstance(raised.value, CastmeshError)
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is CommunicatorError and again.code == "FAILED_PRECONDITION"
    assert str(again) == str(raised.value)
    from castmesh.rdma import RdmaError

    assert RdmaError is castmesh.errors.RdmaError and issubclass(RdmaError, CastmeshError)
    assert ProcError("x").code == "UNKNOWN"


@pytest.mark.timeout(60)
def test_a_call_to_a_stopped_actor_names_its_code():
    mesh = this_proc().spawn("errors_echo", Echo)
    assert mesh.echo.call_one(3).get(timeout=30) == 3
    mesh.stop().get(timeout=30)
    with pytest.raises(ProcError) as raised:
        mesh.echo.call_one(4).get(timeout=30)
    assert raised.value.code in ("UNAVAILABLE", "ABORTED", "NOT_FOUND", "CANCELLED")
    assert f"{raised.value.code}: " in str(raised.value)  # the text names it as before
    assert raised.value.endpoint == "echo"
