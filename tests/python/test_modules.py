"""The package's modules: each imports on its own, none imports another in a
circle, the mesh modules import what they need at their top (no import held
back inside a function to break a circle), and every public name is still
where user code finds it (``castmesh``, ``castmesh.mesh``)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from typing import Dict, List, Optional, Set

import pytest

import castmesh

PACKAGE_DIR = os.path.dirname(castmesh.__file__)

# The modules that imported each other in a circle (mesh, instance, ports and
# the actor server, then castmesh._host) and those split out of castmesh.mesh.
MESH_MODULES = ["castmesh._actor_server", "castmesh._replies", "castmesh._runtime", "castmesh.actor",
                "castmesh.actor_mesh", "castmesh.host_mesh", "castmesh.instance", "castmesh.mesh",
                "castmesh.ports", "castmesh.proc_mesh", "castmesh.spmd", "castmesh.supervision", "castmesh.job"]


def _module_files() -> Dict[str, str]:
    """Every Python module of the package: name -> file."""
    out: Dict[str, str] = {}
    for folder, _dirs, files in os.walk(PACKAGE_DIR):
        for file in files:
            if not file.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, file), os.path.dirname(PACKAGE_DIR))[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = os.path.join(folder, file)
    return out


MODULES = _module_files()
# Compiled modules (castmesh._castmesh): imported, never importing the package back.
EXTENSIONS = {"castmesh." + name.split(".")[0] for name in os.listdir(PACKAGE_DIR)
              if name.endswith((".so", ".pyd")) and not name.startswith(".")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_statements(body: List[ast.stmt]) -> List[ast.stmt]:
    """The import statements run when the module is imported: at its top, in
    top-level try/if/with blocks and class bodies, not in functions nor under
    ``if TYPE_CHECKING:``."""
    out: List[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                out += _import_time_statements(node.body)
            out += _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                out += _import_time_statements(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            out += _import_time_statements(node.body)
    return out


def _package_of(module: str) -> str:
    return module if MODULES[module].endswith("__init__.py") else module.rpartition(".")[0]


def _targets(module: str, node: ast.stmt) -> Set[str]:
    """The package modules an import statement of `module` imports."""
    found: Set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in MODULES:
                found.add(alias.name)
        return found
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = _package_of(module)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    submodules = {f"{source}.{alias.name}" for alias in node.names} & (set(MODULES) | EXTENSIONS)  # from . import x
    found |= submodules - EXTENSIONS
    if source in MODULES and len(submodules) < len(node.names):  # a name defined in `source` itself
        found.add(source)
    return found


def _type_only(tree: ast.Module) -> Set[int]:
    """The nodes under a top-level ``if TYPE_CHECKING:`` (never run)."""
    return {id(node) for top in tree.body if isinstance(top, ast.If) and _is_type_checking(top.test)
            for node in ast.walk(top)}


def _import_graph(in_functions: bool) -> Dict[str, Set[str]]:
    """module -> the package modules it imports when imported (and, with
    `in_functions`, when any of its functions runs)."""
    graph: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
        if in_functions:
            type_only = _type_only(tree)
            statements = [node for node in ast.walk(tree)
                          if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in type_only]
        else:
            statements = _import_time_statements(tree.body)
        edges: Set[str] = set()
        for node in statements:
            edges |= _targets(module, node)
        edges.discard(module)
        graph[module] = edges
    return graph


def _find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A cycle of `graph` as the list of its modules (first repeated last), or None."""
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_the_mesh_modules_imports():
    assert "castmesh._castmesh" in EXTENSIONS
    graph = _import_graph(in_functions=False)
    # Spot checks that the walk resolves relative imports (else "no cycle" proves nothing).
    assert "castmesh.actor_mesh" in graph["castmesh.proc_mesh"]
    assert "castmesh.proc_mesh" in graph["castmesh.host_mesh"]
    assert "castmesh._runtime" in graph["castmesh.ports"]
    assert "castmesh.supervision" in graph["castmesh._replies"]
    assert "castmesh.ports" in graph["castmesh._actor_server"]


@pytest.mark.parametrize("in_functions", [False, True], ids=["at_import", "also_in_functions"])
def test_no_module_imports_itself_through_a_circle(in_functions):
    """No circle among the modules, also counting the imports inside
    functions (a circle held apart by them is still a circle)."""
    cycle = _find_cycle(_import_graph(in_functions))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", MESH_MODULES)
def test_mesh_modules_import_at_their_top(module):
    """No import of another castmesh module inside a function of the mesh
    modules (the old circle was held apart by 33 of them)."""
    path = MODULES[module]
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), path)
    at_import = {id(node) for node in _import_time_statements(tree.body)}
    type_only = _type_only(tree)
    late = [f"{os.path.basename(path)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in at_import
            and id(node) not in type_only and _targets(module, node)]
    assert late == [], f"imports inside functions: {late}"


def _numpy_missing(module: str) -> bool:
    return (module == "castmesh.MPI" or module.startswith("castmesh._mpi")) and \
        importlib.util.find_spec("numpy") is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_on_its_own(module):
    """In a fresh interpreter, importing the module first (before anything
    else of castmesh's) works: no import order is needed to break a circle."""
    if _numpy_missing(module):
        pytest.skip(f"{module} needs NumPy, which is not installed here")
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(PACKAGE_DIR)})
    assert out.returncode == 0, out.stderr


def test_public_names_stay_where_they_were():
    import castmesh.mesh as mesh

    for name in ("ProcMesh", "ActorMesh", "EndpointRef", "Endpoint", "Accumulator", "as_endpoint", "ResultStream",
                 "Rendezvous", "rendezvous_proc_mesh", "this_host", "this_proc"):
        assert getattr(mesh, name) is getattr(castmesh, name), name
    for name in castmesh.__all__:
        assert hasattr(castmesh, name), name
    # castmesh.mesh is reachable after a plain `import castmesh`, as before.
    assert castmesh.mesh is mesh
    assert castmesh.instance.ActorAborted.__module__ == "castmesh.instance"
