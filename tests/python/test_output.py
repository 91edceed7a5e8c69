"""Output of procs forwarded to the controller (ProcMesh.logging_option;
docs/procs.md, "Output of procs"): complete and in each proc's order,
prefixed with the proc's point and host, stdout to stdout and stderr to
stderr, aggregated within a window. Each scenario is its own controller
process (tests/python/output/controller.py) whose output the test reads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run(scenario: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(HERE / "output" / "controller.py"), scenario], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.timeout(300)
def test_100000_lines_of_8_ranks_arrive_complete_and_in_each_ranks_order() -> None:
    out = run("many").stdout
    by_rank = defaultdict(list)
    pattern = re.compile(r"^\[ranks=(\d+)@[^\]]+\] rank (\d+) line (\d+)$")
    for line in out.splitlines():
        match = pattern.match(line)
        if match:
            assert match.group(1) == match.group(2), f"the prefix names the writer: {line}"
            by_rank[int(match.group(1))].append(int(match.group(3)))
    assert sorted(by_rank) == list(range(8))
    for rank, numbers in by_rank.items():
        assert numbers == list(range(12_500)), f"rank {rank}: {len(numbers)} lines, in order: {numbers == sorted(numbers)}"


@pytest.mark.timeout(120)
def test_identical_lines_within_the_window_are_printed_once_with_a_count() -> None:
    out = run("aggregate").stdout
    lines = [line for line in out.splitlines() if line.endswith("the same line everywhere")]
    assert len(lines) == 1, out
    assert re.match(r"^\[ranks=\d@[^\]]+ and 3 more\] the same line everywhere$", lines[0]), lines[0]


@pytest.mark.timeout(120)
def test_fd_level_writes_and_logging_keep_their_stream_and_the_actor_logger_carries_the_rank() -> None:
    proc = run("streams")
    assert len(re.findall(r"^\[ranks=\d@[^\]]+\] written at fd 1 by C-level code$", proc.stdout, re.M)) == 4, proc.stdout
    assert len(re.findall(r"^\[ranks=\d@[^\]]+\] written at fd 2 by C-level code$", proc.stderr, re.M)) == 4, proc.stderr
    assert "written at fd 2" not in proc.stdout and "written at fd 1" not in proc.stderr
    warnings = re.findall(r"^\[ranks=(\d)@[^\]]+\] WARNING castmesh\.actor\.Writer\.(\d): a warning of the actor$",
                          proc.stderr, re.M)
    assert sorted(warnings) == [(str(r), str(r)) for r in range(4)], proc.stderr
