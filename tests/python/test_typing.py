"""Endpoints are typed: a mesh's adverbs take the endpoint method's
parameters (ParamSpec) and give its result (mypy checks a user's program)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import castmesh

PROGRAM = textwrap.dedent(
    """
    from castmesh import Actor, Port, endpoint, this_host

    class Pinger(Actor):
        @endpoint
        def ping(self, n: int) -> int:
            return n

        @endpoint
        async def echo(self, text: str, times: int = 1) -> str:
            return text * times

        @endpoint(explicit_response_port=True)
        def later(self, port: Port, n: int) -> None:
            port.send(n)

        @endpoint
        def inside(self) -> int:
            return self.ping(2) + 1          # the method itself, inside the actor

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("pinger", Pinger)
    reveal_type(mesh.ping.call_one(1))
    reveal_type(mesh.echo.call("a", times=2))
    reveal_type(mesh.slice(gpus=0).ping.choose(3))
    mesh.later.broadcast(4)
    mesh.ping.call_one("not an int")         # line 25: arg-type
    mesh.echo.call_one("a", twice=True)      # line 26: call-arg
    """
)


def test_mypy_checks_endpoint_arguments_and_results(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed here (scripts/test.sh installs it into the tools venv)")
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    package_root = os.path.dirname(os.path.dirname(castmesh.__file__))
    env = dict(os.environ)
    if os.path.realpath(package_root) != os.path.realpath(sysconfig.get_paths()["purelib"]):
        env["MYPYPATH"] = package_root  # a build tree on PYTHONPATH (mypy does not read PYTHONPATH)
    out = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--show-error-codes",
                          "--no-error-summary", "--no-incremental", "--cache-dir", os.devnull, program.name],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    program = program.relative_to(tmp_path)
    # (mypy before 1.16 spells int "builtins.int"; a note may say where call_one is defined.)
    lines = [line.split(": ", 1)[1].replace("builtins.", "") for line in out.stdout.splitlines()
             if line.startswith("program.py:") and "defined in" not in line]
    assert lines == [
        'note: Revealed type is "castmesh.future.Future[int]"',
        'note: Revealed type is "castmesh.future.Future[castmesh.shape.ValueMesh[str]]"',
        'note: Revealed type is "castmesh.future.Future[int]"',
        'error: Argument 1 to "call_one" of "EndpointRef" has incompatible type "str"; expected "int"  [arg-type]',
        'error: Unexpected keyword argument "twice" for "call_one" of "EndpointRef"  [call-arg]',
    ], out.stdout + out.stderr
