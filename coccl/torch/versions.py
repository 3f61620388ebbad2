"""The torch versions coccl.torch supports, checked when it is imported.

One range, stated here and in pyproject.toml's ``torch`` extra and the README: the
backend relies on torch internals (a Python ``ProcessGroup`` subclass, ``dist._Work``,
``Backend.register_backend(..., extended_api=True)``, 2.13's ``_single`` collectives,
``torch._C._current_graph_task_id`` for a collective's direction)
that older and newer versions may lack or change.
"""

from __future__ import annotations

import re

TORCH_RANGE = ("2.11", "2.13")  # the first and last supported minor versions


def _minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]))


def check_torch_version(version: str) -> None:
    """ImportError naming the supported range and ``version`` if it is outside it.

    Args:
        version: a torch version string (``torch.__version__``, e.g. ``"2.13.0+cpu"``).
    """
    low, high = (_minor(v) for v in TORCH_RANGE)
    found = _minor(version)
    if found is None or not low <= found <= high:  # type: ignore[operator]
        raise ImportError(
            f"coccl.torch supports torch {TORCH_RANGE[0]} to {TORCH_RANGE[1]}, found torch "
            f"{version}: install a torch in that range (pip install 'coccl[torch]')"
        )
