"""The project is Apache-2.0: the top-level LICENSE holds the license's full
text, and every wheel's project metadata (pyproject.toml of the core and of
each plugin package) declares it."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECTS = [ROOT / "pyproject.toml"] + sorted((ROOT / "python" / "packages").glob("*/pyproject.toml"))


@pytest.mark.timeout(30)
def test_license_file_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    # The terms end with section 9 and the appendix on how to apply them.
    for heading in ("1. Definitions.", "4. Redistribution.", "9. Accepting Warranty or Additional Liability.",
                    "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert heading in text, heading


@pytest.mark.timeout(30)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
@pytest.mark.parametrize("pyproject", PROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_wheel_declares_the_license(pyproject):
    import tomllib

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]


def test_every_plugin_package_is_checked():
    assert len(PROJECTS) >= 3  # the core and the rdma and tensor_engine plugins
