"""What the pytest modules on network-namespace hosts share (tests/python:
test_hosts.py, test_hosts_tls.py): their skip marks, their processes'
environment and polling a condition."""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List

import pytest

import netns_hosts

# Under the ASan stage every child inherits the preloaded sanitizer runtime,
# the namespace tools (ip, unshare, sh) included: these run in the dev stage.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")


def marks() -> List[pytest.MarkDecorator]:
    """A module's pytestmark: skipped with the reason where namespaces cannot
    be made (not root) and under ASan; where CI's dev stage requires them
    (CASTMESH_REQUIRE_NETNS=1), a skip would hide a broken stage: it raises."""
    reason = netns_hosts.skip_reason()
    if os.environ.get("CASTMESH_REQUIRE_NETNS") == "1" and not SANITIZED and reason is not None:
        raise RuntimeError(f"CASTMESH_REQUIRE_NETNS=1 but namespaces cannot be made here: {reason}")
    return [
        pytest.mark.skipif(reason is not None, reason=f"needs network namespaces: {reason}"),
        pytest.mark.skipif(SANITIZED, reason="host tests run in the dev stage, not under the preloaded ASan runtime"),
    ]


def env(secret: str, **extra: str) -> Dict[str, str]:
    """This process's environment for an agent or controller of a test: the
    mesh secret `secret` (no secret file), unbuffered output, and `extra`."""
    out = dict(os.environ)
    out.pop("CASTMESH_SECRET_FILE", None)
    out.update(CASTMESH_SECRET=secret, PYTHONUNBUFFERED="1")
    out.update(extra)
    return out


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Polls `condition` every 0.1 s for up to `timeout` s: whether it came true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()
