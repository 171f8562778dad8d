"""The package's layers, walked from its imports (AST): no module imports a layer above its own, and no
import cycle exists, not even through imports made only for type checking.

Layers, bottom up (docs/architecture.md tells what each holds). A module may import its own layer and the
ones below; the package root (``clawvm/__init__.py``) is the public API and may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "clawvm"

#: top-level name under ``clawvm`` -> its layer (a rank: higher is further from the storage)
LAYERS: dict[str, int] = {
    "core": 0,
    "store": 1,
    "write": 2,
    "recall": 3,
    "vm": 4,
    "teams": 5,
    "agents": 6,
    "observe": 7,
    "harness": 8,
    "integrations": 9,
    "dashboard": 9,
    "demo": 10,
    "server": 10,
    "replay": 9,
    "cli": 11,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every clawvm module ``name`` imports (relative ones resolved; ``from x import y`` counts y when y is
    a module), at any depth of the file: inside functions and ``if TYPE_CHECKING`` too.

    A module's own packages are left out when it imports their submodules only (``from clawvm.store import
    snapshot``); a name one of them re-exports (``from clawvm.store import Event``) counts the package,
    whose ``__init__`` imports its engines: that is how a submodule closes a cycle through its package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    re_exported_by: set[str] = set()  # packages a name (not a submodule) was imported from
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            out.add(module)
            named = {f"{module}.{alias.name}" for alias in node.names}
            out.update(named)
            if not named <= MODULES.keys():
                re_exported_by.add(module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)

    def counted(m: str) -> bool:
        own_package = m != "clawvm" and name.startswith(m + ".")
        return m in MODULES and m != name and (not own_package or m in re_exported_by)

    return {m for m in out if counted(m)}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:  # the package root: the public API, above everything
        return None
    top = parts[1]
    assert top in LAYERS, f"{module}: put it in a layer (tests/test_layers.py LAYERS)"
    return LAYERS[top]


def test_every_module_belongs_to_a_layer() -> None:
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) is not None))
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    own = _layer(module)
    assert own is not None
    upward = sorted(dep for dep in GRAPH[module] if dep == "clawvm" or (_layer(dep) or 0) > own)
    assert not upward, f"{module} (layer {own}) imports above itself: {upward}"


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, path)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_walk_sees_type_only_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: an import under TYPE_CHECKING, a relative one and one of the root are seen."""
    probe = tmp_path / "shared.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nfrom clawvm import Memory\n"
        "if TYPE_CHECKING:\n    from ..harness import Harness\n"
    )
    assert {"clawvm", "clawvm.harness"} <= _imports("clawvm.teams.shared", probe)
    # a submodule of its own package: a name the package re-exports counts the package, a submodule not
    probe.write_text("from clawvm.store import snapshot\n")
    assert _imports("clawvm.store.crypto", probe) == {"clawvm.store.snapshot"}
    probe.write_text("from clawvm.store import Event, snapshot\n")
    assert _imports("clawvm.store.crypto", probe) == {"clawvm.store", "clawvm.store.snapshot"}
