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
from typing import Iterator, List, Tuple

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


# Mesh failures that reached the session's hook (below): while a test runs,
# under its node id (that test fails); between tests, under "" (the session fails).
_unexpected_failures: List[Tuple[str, str]] = []
_running_test = ""


@pytest.fixture(autouse=True, scope="session")
def _unexpected_failures_fail() -> Iterator[None]:
    """A mesh failure nobody handles ends the controller (castmesh's default
    unhandled_fault_hook). While all suites share one process (the wheel
    stage), such a failure must fail the test it happened in, not end the
    rest: the hook records it, the test fails at teardown
    (_no_unexpected_failure), and one that arrives between tests fails the
    session (pytest_sessionfinish). Tests that expect failures install their
    own hook (the ``faults`` fixture); the default one is tested in a subprocess."""
    import castmesh  # noqa: PLC0415 - the suites' own import; conftest loads before them

    def record(failure: object) -> None:
        _unexpected_failures.append((_running_test, str(failure)))
        print(f"unexpected mesh failure ({_running_test or 'between tests'}): {failure}", file=sys.stderr)

    default = castmesh.unhandled_fault_hook
    castmesh.unhandled_fault_hook = record
    yield
    castmesh.unhandled_fault_hook = default


@pytest.fixture(autouse=True)
def _no_unexpected_failure(request: pytest.FixtureRequest, _unexpected_failures_fail: None) -> Iterator[None]:
    global _running_test  # noqa: PLW0603 - read by the hook, on the supervision thread
    _running_test = request.node.nodeid
    yield
    _running_test = ""
    mine = [failure for test, failure in _unexpected_failures if test == request.node.nodeid]
    if mine:
        pytest.fail(f"{len(mine)} unexpected mesh failure(s) during this test (castmesh.unhandled_fault_hook):\n"
                    + "\n".join(mine), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A test that passed while a mesh failure reached the hook fails (one
    that arrives during teardown fails it there, _no_unexpected_failure)."""
    outcome = yield
    report = outcome.get_result()
    mine = [failure for test, failure in _unexpected_failures if test == item.nodeid]
    if call.when == "call" and report.passed and mine:
        report.outcome = "failed"
        report.longrepr = (f"{len(mine)} unexpected mesh failure(s) during this test "
                           "(castmesh.unhandled_fault_hook):\n" + "\n".join(mine))
        # Reported once: the teardown check skips what failed the call.
        _unexpected_failures[:] = [(t, f) for t, f in _unexpected_failures if t != item.nodeid]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del exitstatus
    between = [failure for test, failure in _unexpected_failures if not test]
    if between:
        print(f"\n{len(between)} unexpected mesh failure(s) between tests (castmesh.unhandled_fault_hook):\n"
              + "\n".join(between), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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

