"""``algorithm="auto"``: below a minimum message size a codec's fixed cost does not pay,
so auto runs the transport's own collective uncompressed; above it, the compressed
two-shot schedule (two quantizations whatever the rank count).

The thresholds are measured with ``coccl-bench`` (see bench/NOTES.md for the command and
the sweep); a threshold is the smallest message size from which the compressed schedule
was at least as fast as native at every larger size measured.
"""

from __future__ import annotations

from coccl.compressors import Compressor, get_compressor

# (transport, "cpu" | "gpu") -> bytes of input from which compression pays.
MIN_COMPRESSED_BYTES: dict[tuple[str, str], int] = {
    ("mpi", "cpu"): 1 << 20,
    ("mpi", "gpu"): 1 << 20,
    ("nccl", "gpu"): 64 << 20,
}


def choose(
    collective: str, nbytes: int, codec: Compressor, transport: str, on_device: bool, size: int
) -> tuple[str, Compressor]:
    """Return ``(algorithm, codec)`` for an ``auto`` call of ``nbytes`` input bytes."""
    if codec.lossless or size == 1:
        return "native", get_compressor("identity")
    threshold = MIN_COMPRESSED_BYTES.get((transport, "gpu" if on_device else "cpu"), 1 << 20)
    if nbytes < threshold:
        return "native", get_compressor("identity")
    return "two_shot", codec
