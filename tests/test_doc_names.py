"""Every module name and repository path that the library's prose mentions exists, so a
move or a rename that leaves a comment behind is a failing test."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("coccl", "algorithms", "compressors")
DOTTED = re.compile(r"\bcoccl(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"\b(?:bench|compressors|tests|examples|algorithms|coccl)/[A-Za-z0-9_./-]*")


def _texts() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for folder in LIBRARY
        for p in sorted((ROOT / folder).rglob("*.py"))
    }


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


TEXTS = _texts()


@pytest.mark.parametrize("path", sorted(TEXTS))
def test_dotted_names_resolve(path: str) -> None:
    names = sorted({m.rstrip(".") for m in DOTTED.findall(TEXTS[path])})
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{path} names what does not exist: {missing}"


@pytest.mark.parametrize("path", sorted(TEXTS))
def test_paths_exist(path: str) -> None:
    paths = sorted({m.rstrip(".,;:)") for m in PATH.findall(TEXTS[path])})
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"{path} mentions paths that do not exist: {missing}"
