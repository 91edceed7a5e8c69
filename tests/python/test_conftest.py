"""The suites' conftest.py fails a test in which a mesh failure reaches the
unhandled-fault hook unexpectedly (it used to print a line and pass)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

INNER = textwrap.dedent(
    """
    import sys
    import time

    from castmesh import Actor, endpoint, this_host


    class Doomed(Actor):
        @endpoint
        def die(self):
            raise SystemExit(5)


    def test_a_failure_nobody_expects():
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        doomed = procs.spawn("doomed", Doomed)
        try:
            doomed.die.call_one().get(timeout=30)
        except Exception:
            pass
        recorded = sys.modules["conftest"]._unexpected_failures
        deadline = time.monotonic() + 60
        while not recorded and time.monotonic() < deadline:  # the hook runs on the supervision thread
            time.sleep(0.05)
        procs.stop().get()


    def test_a_quiet_one():
        pass
    """
)


@pytest.mark.timeout(150)
def test_an_unexpected_mesh_failure_fails_its_test(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "1 failed, 1 passed" in text, text
    assert "unexpected mesh failure(s) during this test" in text and "doomed" in text, text
