"""Shared pytest configuration for the castmesh Python suites.

A process has one controller address: the first proc mesh (or Rendezvous)
fixes it.  CTest runs each test file in its own process, but a plain
``pytest tests/python`` (and the wheel stage of CI) runs them all in one, so
the modules that must choose that address themselves run first.

Every test has a time limit so that a hang fails instead of stalling CI:
``@pytest.mark.timeout(seconds)`` (default ``DEFAULT_TIMEOUT_S``). When it
passes, SIGALRM fails the test with a traceback of where it was waiting;
if the test cannot be interrupted (stuck in C++ without checking signals),
faulthandler dumps every thread and ends the process a little later. The
pytest-timeout plugin, where installed, takes over the same marker.
"""

import faulthandler
import signal
import sys
from typing import Iterator, List

import pytest

# Modules whose fixtures make the process's controller listen at an address
# of their choosing; anything that runs before them would take a private one.
_ADDRESS_CHOOSERS = ("test_rendezvous.py",)

DEFAULT_TIMEOUT_S = 180
# How long after the SIGALRM the process is ended if the test did not stop.
_HARD_STOP_GRACE_S = 30


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): fail the test if it runs longer than this")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    del config
    items.sort(key=lambda item: item.path.name not in _ADDRESS_CHOOSERS)


@pytest.fixture(autouse=True, scope="session")
def _failures_do_not_end_the_session() -> Iterator[None]:
    """A mesh failure nobody handles ends the controller (castmesh's default
    unhandled_fault_hook); while all suites share one process (the wheel
    stage), a failure reported after its test ended must not end the rest.
    Tests that expect failures install their own hook; the default one is
    tested in a subprocess."""
    import castmesh

    def report(failure: object) -> None:
        print(f"unexpected mesh failure outside a test that expects one: {failure}", file=sys.stderr)

    default = castmesh.unhandled_fault_hook
    castmesh.unhandled_fault_hook = report
    yield
    castmesh.unhandled_fault_hook = default


class TimeLimitExceeded(Exception):
    """Raised in the test's thread when its time limit passes."""


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.config.pluginmanager.hasplugin("timeout"):
        yield
        return
    marker = request.node.get_closest_marker("timeout")
    seconds = int(marker.args[0]) if marker and marker.args else DEFAULT_TIMEOUT_S

    def expire(signum: int, frame: object) -> None:
        del signum, frame
        raise TimeLimitExceeded(f"{request.node.nodeid} ran longer than its {seconds} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    faulthandler.dump_traceback_later(seconds + _HARD_STOP_GRACE_S, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture()
def faults(monkeypatch: pytest.MonkeyPatch) -> List[object]:
    """Failures reach castmesh.unhandled_fault_hook; record them instead of exiting."""
    import castmesh  # noqa: PLC0415 - the suites' own import; conftest loads before them

    seen: List[object] = []
    monkeypatch.setattr(castmesh, "unhandled_fault_hook", seen.append)
    return seen

