"""Checks of call options that every face shares (the Communicator, the virtual-rank
simulator, the torch.distributed backend's options), so each option is refused alike."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_chunk_bytes(chunk_bytes: Any) -> None:
    """ValueError unless ``chunk_bytes`` is None (the sizing rules decide) or a positive
    integer (a bool is not one)."""
    if chunk_bytes is not None and (
        isinstance(chunk_bytes, bool)
        or not isinstance(chunk_bytes, (int, np.integer))
        or chunk_bytes < 1
    ):
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
