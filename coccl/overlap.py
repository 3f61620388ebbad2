"""Stand-ins that split a pipelined collective into its two halves, to measure overlap.

``overlap_efficiency = max(codec-only time, transport-only time) / pipelined time``
(1.0: the shorter half hides completely behind the longer). The three runs use the same
schedule, chunks and buffers:

* codec-only: ``NullTransport`` completes every message at once and moves nothing (the
  received payload bytes are whatever the buffer held), so only the compute runs;
* transport-only: ``WireOnlyCodec`` has the real codec's payload sizes but encodes and
  decodes nothing, so only the messages (and staging copies) run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coccl.compressors import Compressor


class NullTransport:
    """A transport whose sends and receives complete immediately without moving bytes."""

    name = "null"
    cuda_aware = True
    bytes_sent = 0

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def isend(self, buf: Any, peer: int, tag: int, landed: bool = False) -> Any:
        return _Complete(peer)

    def irecv(self, buf: Any, peer: int, tag: int, forward: bool = False) -> Any:
        return _Complete(peer)

    def finish(self) -> None:
        pass

    def pools(self) -> list[Any]:
        return []


class _Complete:
    __slots__ = ("peer",)

    def __init__(self, peer: int) -> None:
        self.peer = peer

    @staticmethod
    def test() -> bool:
        return True


class WireOnlyCodec(Compressor):
    """The payload sizes of ``inner`` with no encoding or decoding work."""

    codec_id = "wire-only"

    def __init__(self, inner: Compressor) -> None:
        self.inner = inner
        self.dtypes = inner.dtypes
        self.ops = inner.ops

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "inner": self.inner.get_config()}

    @property
    def alignment(self) -> int:
        return self.inner.alignment

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        return self.inner.encoded_nbytes(count, dtype)

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        pass

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        pass

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        # the real codec's schedule (a fused ring hop, or load + reduce + encode), minus
        # its work: with a hop the ring holds no accumulator to load
        if self.inner.reduce_encode_kernel(like, dtype) is None:
            return None
        return _no_hop


def _no_hop(own: Any, payload: Any, out: Any) -> None:
    pass


__all__ = ["NullTransport", "WireOnlyCodec"]
