"""Every ```python block of the docs (docs/**/*.md) and of README.md runs, each in its own interpreter.

A block that cannot run here (it needs mpirun, Slurm, a GPU, other machines, or it is a fragment of a longer
program) is marked on the line before its fence with an HTML comment that says why, which the rendered page does
not show:

    <!-- skip: needs mpirun -->
    ```python
    ...

A skip marker without a reason fails, as does a block that raises, exits non-zero or runs longer than its time
limit (``<!-- timeout: 120 -->`` before the fence raises the default). Each block runs as a script file in an
empty temporary folder (so worker procs can re-import its classes), with castmesh from PYTHONPATH: the dev build's
``build/dev/python`` (CTest and scripts/docs.sh set it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 90
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<key>skip|timeout)\s*:?(?P<value>.*?)-->\s*$")


class Block(NamedTuple):
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    code: str
    skip: Optional[str]  # the reason, or None
    timeout: int


def _markers(lines: List[str], fence_index: int) -> dict:
    """The skip/timeout markers on the lines right above a fence (blank lines between are allowed)."""
    found: dict = {}
    i = fence_index - 1
    while i >= 0:
        text = lines[i]
        if not text.strip():
            i -= 1
            continue
        marker = _MARKER.match(text)
        if not marker:
            break
        found.setdefault(marker.group("key"), marker.group("value").strip())
        i -= 1
    return found


def blocks_of(path: Path) -> List[Block]:
    """The Python blocks of one Markdown file (fences may be indented, e.g. inside a list)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    found: List[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening.group("fence"), opening.group("indent")
        language = (opening.group("info").split() or [""])[0].strip("{}.").lower()
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if language in ("python", "py", "python3"):
            markers = _markers(lines, i)
            skip = markers.get("skip")
            timeout_text = markers.get("timeout")
            timeout = int(timeout_text) if timeout_text and timeout_text.isdigit() else DEFAULT_TIMEOUT_S
            found.append(Block(page, i + 1, textwrap.dedent("\n".join(body)) + "\n", skip, timeout))
        i = j + 1
    return found


def all_blocks() -> List[Block]:
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    return [block for page in pages for block in blocks_of(page)]


BLOCKS = all_blocks()


def test_the_docs_have_python_blocks() -> None:
    # The collector itself: a change of fence syntax must not make every block vanish silently.
    assert len(BLOCKS) >= 10, [b.page for b in BLOCKS]
    assert any(b.page == "README.md" and b.skip is None for b in BLOCKS), "README.md's example must run"


def test_markers_are_read(tmp_path: Path) -> None:
    text = ("x\n<!-- skip: needs mpirun -->\n```python\nprint(1)\n```\n\n<!-- timeout: 200 -->\n```py\npass\n```\n"
            "```cpp\nint x;\n```\n- item\n\n    ```python\n    y = 2\n    ```\n")
    sample = tmp_path / "sample.md"
    sample.write_text(text, encoding="utf-8")
    first, second, third = blocks_of(sample)
    assert third.code == "y = 2\n"
    assert (first.skip, first.code, first.line) == ("needs mpirun", "print(1)\n", 3)
    assert (second.skip, second.timeout) == (None, 200)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        assert block.skip, f"{block.page}:{block.line}: a skip marker needs a reason (<!-- skip: why -->)"
        pytest.skip(f"{block.page}:{block.line}: {block.skip}")
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=block.timeout, check=False)
    except subprocess.TimeoutExpired as timed_out:
        pytest.fail(f"{block.page}:{block.line} ran longer than {block.timeout}s "
                    f"(<!-- timeout: N --> before the fence raises the limit)\n{timed_out.stdout}\n{timed_out.stderr}")
    if done.returncode != 0:
        pytest.fail(f"{block.page}:{block.line} exited with {done.returncode}\n--- code ---\n{block.code}"
                    f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}")
