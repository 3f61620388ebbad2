"""compressors/layout.py (payload layouts, group sizes) and the import structure of the
codec modules: the kernels read layouts from layout.py, never from the codecs, so the
modules import one another without a circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coccl.compressors import Int8Compressor, TacoCompressor
from coccl.compressors.layout import (
    GROUP_SIZES,
    check_group_size,
    int8_layout,
    num_groups,
    taco_layout,
    taco_nbytes,
)

COMPRESSORS = Path(__file__).resolve().parents[1] / "compressors"
PACKAGE = "coccl.compressors"


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere (lazy imports inside functions too)."""
    siblings = {p.stem for p in COMPRESSORS.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from . import a, b / from .a import b
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.module and node.module.startswith(PACKAGE + "."):
                names = [node.module[len(PACKAGE) + 1 :].split(".")[0]]
            elif node.module == PACKAGE:
                names = [a.name for a in node.names]
            else:
                continue
            found |= {n for n in names if n in siblings}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name[len(PACKAGE) + 1 :].split(".")[0])
    return found - {path.stem}


def test_codec_modules_import_without_a_circle() -> None:
    graph = {p.stem: _imports(p) for p in COMPRESSORS.glob("*.py") if p.stem != "__init__"}
    assert "layout" in graph and graph["layout"] == set(), "layout.py imports no codec module"
    for kernels in ("cpu_kernels", "gpu_kernels"):
        assert not graph[kernels] & {"int8", "taco", "identity", "base"}, graph[kernels]
    # Depth-first search for a back edge.
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, set())):
            if state.get(nxt) == 1:
                pytest.fail(f"import circle: {' -> '.join([*path, node, nxt])}")
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


@pytest.mark.launch
@pytest.mark.parametrize("module", ["layout", "cpu_kernels", "_dispatch", "int8", "taco"])
def test_each_module_imports_first(module: str) -> None:
    # A fresh interpreter whose first import is this module (and through it the package).
    code = f"import {PACKAGE}.{module} as m; assert m.__name__ == '{PACKAGE}.{module}'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("count", [0, 1, 31, 127, 128, 129, 1000, 4096 + 77])
@pytest.mark.parametrize("group_size", [32, 128, 100])
def test_int8_layout(count: int, group_size: int) -> None:
    k = (count + group_size - 1) // group_size
    assert num_groups(count, group_size) == k
    assert int8_layout(count, group_size) == (k, count, count + 4 * k)


@pytest.mark.parametrize("count", [0, 1, 31, 128, 129, 1000])
@pytest.mark.parametrize("ash", [True, False])
@pytest.mark.parametrize("dual_scale", [True, False])
def test_taco_layout(count: int, ash: bool, dual_scale: bool) -> None:
    g = 64
    k = (count + g - 1) // g
    layout = taco_layout(count, g, ash=ash, dual_scale=dual_scale)
    assert layout.groups == k
    assert layout.nbytes == taco_nbytes(count, g, ash, dual_scale)
    assert layout.nbytes == k * g + 4 * k * (int(ash) + int(dual_scale))
    assert layout.scale_offset == (k * g if dual_scale else None)
    assert layout.alpha_offset == (k * g + 4 * k * int(dual_scale) if ash else None)


def test_codecs_take_their_sizes_from_the_layouts() -> None:
    for count in (0, 1, 1000):
        for g in GROUP_SIZES:
            assert Int8Compressor(group_size=g).encoded_nbytes(count, np.float32) == (
                int8_layout(count, g).nbytes
            )
            c = TacoCompressor(group_size=g, ash=False)
            assert c.encoded_nbytes(count, np.float32) == taco_layout(count, g, ash=False).nbytes


def test_group_sizes() -> None:
    assert GROUP_SIZES == (32, 64, 128, 256, 512)
    assert [check_group_size(g) for g in GROUP_SIZES] == list(GROUP_SIZES)
    assert check_group_size(np.int64(64)) == 64
    for bad in (16, 48, 1024, 0, -128):
        with pytest.raises(ValueError, match="group_size"):
            check_group_size(bad)
    for bad in (True, 128.0, "128", None):
        with pytest.raises(TypeError, match="group_size"):
            check_group_size(bad)
