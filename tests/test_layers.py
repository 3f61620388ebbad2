"""The declared layering (DESIGN.md, "Layers"), checked by walking every module's imports.

L0 ``coccl.core``, ``coccl.errors``, ``coccl.config``: nothing else of coccl.
L1 ``coccl.compressors``: L0.
L2 ``coccl.algorithms``: L0, L1. ``coccl.transports``, ``coccl.engine``: L0 (and
   their own package).
L3 ``coccl.communicator`` and the package ``coccl`` itself: anything below.
L4 ``coccl.torch``, ``coccl.bench``, ``examples`` and the kept import paths
   ``coccl.tensor_parallel``, ``coccl.virtual_ranks``: public names only (no
   ``_``-prefixed name of another package).

Every import counts, also one inside a function, so a circle cut by a late import is
still a circle. Also: no import circle between modules or between packages, no library
file over 600 lines (the CUDA sources in compressors/ too), the Communicator's file within
400, no library function over 60.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Folder -> the package it installs as (pyproject's package-dir), and examples.
FOLDERS = {
    "coccl": "coccl",
    "algorithms": "coccl.algorithms",
    "compressors": "coccl.compressors",
    "bench": "coccl.bench",
    "examples": "examples",
}
LIBRARY = ("coccl", "algorithms", "compressors")
TOP_MODULES = {
    "coccl",
    "coccl.config",
    "coccl.errors",
    "coccl.tensor_parallel",
    "coccl.virtual_ranks",
}
L4_SHIMS = ("coccl.tensor_parallel", "coccl.virtual_ranks")
FACE = "coccl.communicator.face"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[_module_name(path)] = path
    return found


FILES = _files()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in FILES.items()}


def _is_package(name: str) -> bool:
    return FILES[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """``(module, names imported from it, line)`` of every coccl import in ``name``."""
    found = []
    base = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - node.level + 1]
                module = ".".join([*anchor, module] if module else anchor)
            names = [a.name for a in node.names]
            # "from pkg import mod" imports the module pkg.mod
            modules = [f"{module}.{n}" for n in names if f"{module}.{n}" in FILES]
            found += [(m, [], node.lineno) for m in modules]
            rest = [n for n in names if f"{module}.{n}" not in FILES]
            if rest or not modules:
                found.append((module, rest, node.lineno))
    return [(m, n, line) for m, n, line in found if m in FILES or m.split(".")[0] == "coccl"]


def _package(name: str) -> str:
    """The node of the package graph a module belongs to (the modules beside the
    subpackages, such as ``coccl.config``, are nodes of their own)."""
    if name in TOP_MODULES:
        return name
    return name if _is_package(name) and name.count(".") <= 1 else ".".join(name.split(".")[:2])


def _layer(name: str) -> tuple[int, str]:
    """``(layer, group)`` of a module."""
    if name in L4_SHIMS or name.split(".")[0] == "examples":
        return 4, "public"
    package = _package(name)
    table = {
        "coccl.core": (0, "core"),
        "coccl.config": (0, "core"),
        "coccl.errors": (0, "core"),
        "coccl.compressors": (1, "compressors"),
        "coccl.algorithms": (2, "algorithms"),
        "coccl.transports": (2, "transports"),
        "coccl.engine": (2, "engine"),
        "coccl.communicator": (3, "communicator"),
        "coccl": (3, "communicator"),
        "coccl.torch": (4, "public"),
        "coccl.bench": (4, "public"),
    }
    if package not in table:
        raise AssertionError(f"{name} is in no declared layer: add its package to the table")
    return table[package]


# What each group may import (by group); the public layer may import anything public.
ALLOWED = {
    "core": {"core"},
    "compressors": {"core", "compressors"},
    "algorithms": {"core", "compressors", "algorithms"},
    "transports": {"core", "transports"},
    "engine": {"core", "engine"},
    "communicator": {"core", "compressors", "algorithms", "transports", "engine", "communicator"},
    "public": {
        "core",
        "compressors",
        "algorithms",
        "transports",
        "engine",
        "communicator",
        "public",
    },
}


def _target(module: str) -> str:
    """The module an import resolves to (``coccl.x.y`` may name an attribute of x)."""
    while module not in FILES and "." in module:
        module = module.rpartition(".")[0]
    return module


def _edges() -> dict[str, set[str]]:
    return {
        name: {_target(m) for m, _, _ in _imports(name) if _target(m) in FILES} - {name}
        for name in FILES
    }


@pytest.mark.parametrize("name", sorted(FILES))
def test_imports_follow_the_layers(name: str) -> None:
    _, group = _layer(name)
    wrong = []
    for module, _, line in _imports(name):
        target = _target(module)
        if target not in FILES:
            continue
        if target.split(".")[:2] in (["coccl", "bench"], ["examples"]) and group != "public":
            wrong.append(f"line {line}: the library imports {target}")
        elif target.split(".")[0] == "examples" and name.split(".")[0] != "examples":
            wrong.append(f"line {line}: {target} is an example, not a library")
        elif _layer(target)[1] not in ALLOWED[group]:
            wrong.append(f"line {line}: {group} may not import {target} ({_layer(target)[1]})")
    assert not wrong, f"{name}: " + "; ".join(wrong)


def _is_private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not name.endswith("__")


def _private_names(package: str) -> set[str]:
    """Every ``_``-prefixed name a package defines (functions, classes, module globals,
    attributes set on ``self``)."""
    names = set()
    for name, tree in TREES.items():
        if _package(name) != package:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if _is_private(n)}


PUBLIC = sorted(n for n in FILES if _layer(n)[1] == "public")


@pytest.mark.parametrize("name", PUBLIC)
def test_public_layer_uses_public_names_only(name: str) -> None:
    own = _package(name)
    others = set().union(
        *(_private_names(p) for p in {_package(n) for n in FILES} if p != own)
    ) - _private_names(own)
    wrong = []
    for module, imported, line in _imports(name):
        target = _target(module)
        if _package(target) == own:
            continue
        wrong += [f"line {line}: {module}.{n}" for n in imported if _is_private(n)]
        wrong += [f"line {line}: {module}" for p in module.split(".") if _is_private(p)]
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Attribute) and node.attr in others:
            wrong.append(f"line {node.lineno}: .{node.attr}")
    assert not wrong, f"{name} uses private names of other packages: " + "; ".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_circles() -> None:
    assert _cycles(_edges()) == []


def test_no_package_circles() -> None:
    packages: dict[str, set[str]] = {}
    for name, targets in _edges().items():
        mine = _package(name)
        packages.setdefault(mine, set()).update(_package(t) for t in targets)
        packages[mine].discard(mine)
    assert _cycles(packages) == []


def _library_files() -> list[str]:
    return sorted(n for n, p in FILES.items() if p.relative_to(ROOT).parts[0] in LIBRARY)


@pytest.mark.parametrize("name", _library_files())
def test_file_size(name: str) -> None:
    lines = len(FILES[name].read_text().splitlines())
    limit = 400 if name == FACE else 600
    assert lines <= limit, f"{name} has {lines} lines, more than {limit}"


# The CUDA sources beside the codecs (compiled as tuples of files joined in order): held to
# the same limit as the Python files.
CUDA_SOURCES = sorted((ROOT / "compressors").rglob("*.cu"))


@pytest.mark.parametrize("path", CUDA_SOURCES, ids=lambda p: p.name)
def test_cuda_file_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"compressors/{path.name} has {lines} lines, more than 600"


def test_face_defines_the_communicator() -> None:
    classes = [n.name for n in ast.walk(TREES[FACE]) if isinstance(n, ast.ClassDef)]
    assert "Communicator" in classes


FUNCTION_SIZE_PACKAGES = ("core", "communicator", "engine", "transports", "algorithms", "torch")


@pytest.mark.parametrize(
    "name",
    [n for n in _library_files() if n.split(".")[1:2] in [[p] for p in FUNCTION_SIZE_PACKAGES]],
)
def test_function_size(name: str) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(TREES[name])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, f"{name}: " + ", ".join(long)
