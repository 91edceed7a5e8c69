"""Reading a controller that a test runs as its own process (tests/python:
test_hosts.py, test_jobs.py): its output lines, and its end."""

from __future__ import annotations

import subprocess


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Waits up to `timeout` s for the controller to exit 0 and returns its output
    (killed, and the test failed with what it printed, when it does not)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"controller did not finish within {timeout}s:\n{out}") from None
    assert proc.returncode == 0, out
    return out


def wait_for(proc: subprocess.Popen, word: str) -> str:
    """Reads the controller's output up to the first line starting with `word`
    and returns that line; fails with everything it printed if it exits first."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(word):
            return line
    proc.wait()
    raise AssertionError(f"no {word} from the controller (exit {proc.returncode}):\n{''.join(seen)}")
