"""``algorithm="auto"``: below a minimum message size a codec's fixed cost does not pay,
so auto runs uncompressed (exact); from that size on, the compressed two-shot schedule
(two quantizations whatever the rank count). Uncompressed, it runs the transport's own
collective, or coccl's two-shot AllReduce where that was measured to be faster.

The table is measured with ``coccl-bench``; an entry is the smallest size from which the
compressed two-shot schedule was faster than native at every larger size measured, or
None where compression never paid in the measurements (auto then stays native):

* ``("mpi", "gpu")``: H200, 4 ranks sharing the GPU over Open MPI 4.1.6 (pinned host
  staging). taco/int8 two-shot beat native from 16 MiB on (4.9x at 16 MiB, 8.6x at
  256 MiB, float32; 10.7x-14.4x bfloat16) and lost at 4 MiB and below.
  ``bash bench/h200_check.sh "sweeps latency"`` -> h200-mpi-4ranks-latency.json (commit
  596055b) and the sweeps; the later sweeps agree (h200-mpi-4ranks-be9f1ab.json: two_shot
  taco 4.7x native at 16 MiB, 9.6x at 256 MiB; h200-mpi-4ranks-6b65a2e.json: 7.2x and
  12.6x, and at 4 MiB 0.24x float32, 1.2x bfloat16, a single 4-call sample). With Open
  MPI's single-copy shared memory and the check after the timing (h200-mpi-4ranks.json,
  float32 at 134f75e) two_shot taco ran 8.9x native at 16 MiB, 10.2x at 256 MiB, and at
  4 MiB 1.4x, where uncompressed two-shot ran 1.5x: the table was not re-derived from it
  (bfloat16 at 4 MiB read 0.74x at 0258862, before the bench's reorder).
* ``("mpi", "cpu")``: 2-core CPU ranks over shared memory. The numba codecs move fewer
  bytes per second than the memory copies they save, so compression lost at every size
  up to 32 MiB: ``coccl-bench allreduce --np 4 -b 8 -e 64M -f 4 --algorithm
  ring,two_shot --compressor identity,taco,int8`` (bench/NOTES.md).
* ``("nccl", "gpu")``: 2 H200s over NVLink: NCCL's own AllReduce ran 190-313 GB/s at
  64 MiB-1 GiB; coccl's schedules, bound by their host-side rounds, stayed below it at
  every size even with the larger NCCL chunks of h200x2-nccl-chunks.json (float32 ring
  taco 0.6-0.9 of native, bfloat16 0.2-0.6; 4 MiB chunks in h200x2-nccl-2ranks.json:
  0.1-0.2): native NCCL.
"""

from __future__ import annotations

from coccl.compressors import Compressor, get_compressor

# (transport, "cpu" | "gpu") -> input bytes from which compression pays (None: never).
MIN_COMPRESSED_BYTES: dict[tuple[str, str], int | None] = {
    ("mpi", "gpu"): 16 << 20,
    ("mpi", "cpu"): None,
    ("nccl", "gpu"): None,
}

# The same for coccl's uncompressed two-shot AllReduce against the native one: from
# 16 MiB it beat MPICH's MPI_Allreduce on CPU ranks (1.7x at 2 and 4 ranks,
# bench/results/cpu-latency-auto-2ranks.json, cpu-allreduce-4ranks.json) and the staged
# Open MPI one on the H200 (3.2x); at 2 MiB and below it lost.
MIN_IDENTITY_TWO_SHOT_BYTES: dict[tuple[str, str], int | None] = {
    ("mpi", "gpu"): 16 << 20,
    ("mpi", "cpu"): 16 << 20,
    ("nccl", "gpu"): None,
}

_IDENTITY = get_compressor("identity")


def choose(
    collective: str, nbytes: int, codec: Compressor, transport: str, on_device: bool, size: int
) -> tuple[str, Compressor]:
    """Return ``(algorithm, codec)`` for an ``auto`` call of ``nbytes`` input bytes."""
    if size == 1:
        return "native", _IDENTITY
    where = (transport, "gpu" if on_device else "cpu")
    threshold = MIN_COMPRESSED_BYTES.get(where)
    if not codec.lossless and threshold is not None and nbytes >= threshold:
        return "two_shot", codec
    identity_threshold = MIN_IDENTITY_TWO_SHOT_BYTES.get(where)
    if (
        collective == "allreduce"
        and identity_threshold is not None
        and nbytes >= identity_threshold
    ):
        return "two_shot", _IDENTITY
    return "native", _IDENTITY
