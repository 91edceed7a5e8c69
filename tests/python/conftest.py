"""Shared pytest configuration for the castmesh Python suites.

A process has one controller address: the first proc mesh (or Rendezvous)
fixes it.  CTest runs each test file in its own process, but a plain
``pytest tests/python`` (and the wheel stage of CI) runs them all in one, so
the modules that must choose that address themselves run first.
"""

from typing import List

import pytest

# Modules whose fixtures make the process's controller listen at an address
# of their choosing; anything that runs before them would take a private one.
_ADDRESS_CHOOSERS = ("test_rendezvous.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    del config
    items.sort(key=lambda item: item.path.name not in _ADDRESS_CHOOSERS)
