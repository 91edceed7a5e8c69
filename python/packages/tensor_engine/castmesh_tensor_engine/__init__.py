"""The castmesh tensor_engine backend: libcastmesh_tensor_engine.so, loaded by castmesh.

Nothing to import here: install with `pip install "castmesh[tensor-engine]"` and
`castmesh.backends()` finds this library through the `castmesh.backends`
entry point, which calls library_path().
"""

from pathlib import Path


def library_path() -> str:
    """Absolute path of the backend library shipped in this package."""
    return str(Path(__file__).resolve().with_name("libcastmesh_tensor_engine.so"))
