"""Exception types raised by coccl.

Input mistakes use Python's own types, as NumPy and PyTorch do: ``TypeError`` for an
unsupported dtype or array type, ``ValueError`` for shapes, counts, ops and names.
``CocclError`` is for everything that goes wrong while bytes move (transport failures,
timeouts, NCCL errors).
"""

from __future__ import annotations


class CocclError(RuntimeError):
    """A transport or runtime failure inside a collective (never an input mistake)."""


class GraphCaptureError(CocclError):
    """A codec whose GPU kernels a CUDA graph may not capture (``graph_safe`` False) was
    called while the stream captures: it raises instead of recording a graph whose replays
    would compute something else than the eager call."""
