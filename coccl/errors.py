"""Exception types raised by coccl.

Input mistakes use Python's own types, as NumPy and PyTorch do: ``TypeError`` for an
unsupported dtype or array type, ``ValueError`` for shapes, counts, ops and names.
``CocclError`` is for everything that goes wrong while bytes move (transport failures,
timeouts, NCCL errors).
"""

from __future__ import annotations


class CocclError(RuntimeError):
    """A transport or runtime failure inside a collective (never an input mistake)."""
