"""import castmesh: the lazily imported submodules are attributes of the
package (castmesh.collectives.current(), as the README writes it), and the
source tree without its compiled extension says how to build it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SOURCE_PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "python"


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, cwd=Path(__file__).parent)


def test_submodules_are_attributes_of_the_package():
    out = _run("""
        import castmesh
        print(castmesh.collectives.__name__, castmesh.rdma.__name__, castmesh.tensor_engine.__name__)
        try:
            castmesh.collectives.current()
        except castmesh.collectives.CommunicatorError as error:
            print("outside an actor:", error)
    """)
    assert out.returncode == 0, out.stderr
    assert "castmesh.collectives castmesh.rdma castmesh.tensor_engine" in out.stdout
    assert "outside an actor: " in out.stdout


@pytest.mark.skipif(not (SOURCE_PACKAGE_ROOT / "castmesh" / "__init__.py").exists(),
                    reason="needs castmesh's source tree next to the tests")
def test_a_source_tree_without_the_extension_says_how_to_build_it():
    out = _run("import castmesh", PYTHONPATH=str(SOURCE_PACKAGE_ROOT))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: castmesh's compiled extension"), out.stderr
    assert "scripts/run-example.sh" in last and "PYTHONPATH=build/dev/python" in last
    assert "circular import" not in last
