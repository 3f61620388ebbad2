"""A training corpus every Python installation has: its standard library's own sources.

The ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (third-party packages in
``site-packages``/``dist-packages`` and byte-code caches left out), read as bytes in the
order of their POSIX paths relative to that folder, each followed by one newline. A file
belongs to the validation split when the first four bytes of the SHA-256 of its relative
path, read as a big-endian integer, are divisible by 20 (about 5% of the files): the split
depends on the path alone, so it is the same on every machine and Python version that
ship the file. CPython 3.11/3.12 give about 30 MB of bytes (the test suite, ``test/``,
is about 60% of them).

Training batches are non-overlapping windows of ``seq + 1`` bytes (stride ``seq``) in an
order drawn from the run's seed, so no window is seen twice in a run; validation uses
fixed windows spread evenly over the validation split.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EXCLUDED_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__"})
VALIDATION_MODULUS = 20  # 1 file in 20 is held out


@dataclass(frozen=True)
class Corpus:
    """The two splits as uint8 arrays, and how they were made (for the record)."""

    train: np.ndarray
    val: np.ndarray
    info: dict[str, Any]


def source_files(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every ``.py`` file under ``root``, sorted by the
    relative path, third-party packages and caches excluded."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in EXCLUDED_PARTS]  # not entered
        for name in names:
            if name.endswith(".py"):
                path = Path(folder) / name
                files.append((path.relative_to(root).as_posix(), path))
    return sorted(files)


def is_validation(rel: str) -> bool:
    """Whether the file at relative path ``rel`` is held out (a function of the path)."""
    digest = hashlib.sha256(rel.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % VALIDATION_MODULUS == 0


def load_stdlib_corpus(root: Path | None = None) -> Corpus:
    """The standard library's sources (``root``: another folder of ``.py`` files)."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    counts = {False: 0, True: 0}
    for rel, path in source_files(root):
        held_out = is_validation(rel)
        parts[held_out].append(path.read_bytes() + b"\n")
        counts[held_out] += 1
    train = np.frombuffer(b"".join(parts[False]), dtype=np.uint8)
    val = np.frombuffer(b"".join(parts[True]), dtype=np.uint8)
    info = {
        "source": "the .py files of the Python standard library",
        "root": str(root),
        "python": platform.python_version(),
        "order": "sorted by POSIX path relative to root; each file's bytes, then b'\\n'",
        "split": (
            f"validation: files whose sha256(relative path)[:4] (big-endian) % "
            f"{VALIDATION_MODULUS} == 0"
        ),
        "excluded": sorted(EXCLUDED_PARTS),
        "train_files": counts[False],
        "val_files": counts[True],
        "train_bytes": int(train.size),
        "val_bytes": int(val.size),
        "train_sha256": hashlib.sha256(train.tobytes()).hexdigest(),
        "val_sha256": hashlib.sha256(val.tobytes()).hexdigest(),
    }
    return Corpus(train, val, info)


def train_windows(data: np.ndarray, seq: int, batch: int, steps: int, seed: int) -> np.ndarray:
    """``(steps, batch, seq + 1)`` uint8: distinct windows of ``data`` in a seeded order.

    Raises:
        ValueError: ``data`` holds fewer than ``steps * batch`` windows (a run would
            repeat data).
    """
    windows = (data.size - 1) // seq
    needed = steps * batch
    if windows < needed:
        raise ValueError(
            f"the training split holds {windows} windows of {seq + 1} bytes; "
            f"{steps} steps of {batch} need {needed} without repeating"
        )
    order = np.random.default_rng(seed).permutation(windows)[:needed]
    starts = order.reshape(steps, batch) * seq
    return data[starts[..., None] + np.arange(seq + 1)]


def val_windows(data: np.ndarray, seq: int, batch: int, batches: int) -> np.ndarray:
    """``(batches, batch, seq + 1)`` uint8: fixed windows spread evenly over ``data``."""
    windows = (data.size - 1) // seq
    if windows < batches * batch:
        raise ValueError(f"the validation split holds only {windows} windows of {seq + 1}")
    starts = np.linspace(0, windows - 1, num=batches * batch).astype(np.int64) * seq
    return data[starts.reshape(batches, batch)[..., None] + np.arange(seq + 1)]
