"""``algorithm="auto"``: the schedule of a call, from a table measured with ``coccl-bench``.

The rule (README, "Algorithms"):

* a lossy codec named by the caller is always used: auto picks the compressed schedule
  (two-shot: two quantizations whatever the rank count; ring where it was measured
  faster on that link) — it never silently drops the compression that was asked for;
* with the identity codec (the default), auto picks the transport's own collective
  (exact, ``native``) or coccl's uncompressed two-shot where that was measured faster;
* one rank: native.

The table is keyed by where the bytes go: ``(transport, link)`` with the link classes of
``coccl.transports.nccl.DETECTED_LINKS`` for NCCL, ``"staged"`` for device data over MPI through
pinned host memory, ``"host"`` for host data. An entry is the smallest message size (input
bytes) from which coccl's schedule beat native at every larger size measured, or None
where it never did. bench/NOTES.md ("auto") has the measurements and commands behind each
entry; bench/results/ holds the files.
"""

from __future__ import annotations

from dataclasses import dataclass

from coccl.compressors import Compressor, get_compressor

# (transport, link) -> input bytes from which coccl's uncompressed two-shot AllReduce beats
# the transport's own (None: never measured faster; over NCCL it never was, on any link).
IDENTITY_TWO_SHOT_FROM: dict[tuple[str, str], int | None] = {
    ("mpi", "host"): 16 << 20,
    ("mpi", "staged"): 16 << 20,
    ("mpi", "cuda_aware"): None,
}

# (transport, link) -> input bytes from which the compressed ring beat the compressed
# two-shot AllReduce on 2 ranks, where the ring also quantizes each element twice (None:
# two-shot was as fast or faster). On more ranks the ring quantizes n times: auto keeps
# two-shot there. On 2 ranks both sum with the same fused hop and exchange the same
# payloads; they differ in how: two-shot moves both phases as ncclAllGather on the links
# of GATHER_BY_ALLGATHER (faster there than the ring's point-to-point).
COMPRESSED_RING_FROM: dict[tuple[str, str], int | None] = {
    ("nccl", "nvlink"): 4 << 20,
    ("nccl", "shm"): None,
    ("nccl", "socket"): None,
}

# NCCL links on which two-shot's AllGather phase (on two ranks its ReduceScatter exchange
# too) runs as one ncclAllGather of payload slots rather than grouped sends and receives
# (COCCL_NCCL_GATHER=auto): where NCCL's AllGather moved more bytes per second than its
# point-to-point sends (bench/NOTES.md).
GATHER_BY_ALLGATHER: frozenset[str] = frozenset({"shm", "socket", "net"})

_IDENTITY = get_compressor("identity")


def gather_by_allgather(link: str, setting: str) -> bool:
    """Whether a compressed two-shot AllReduce over NCCL on ``link`` gathers through
    ncclAllGather, and on two ranks exchanges its ReduceScatter payloads so too
    (``setting``: COCCL_NCCL_GATHER)."""
    if setting != "auto":
        return setting == "allgather"
    return link in GATHER_BY_ALLGATHER


@dataclass(frozen=True)
class Choice:
    """What ``auto`` runs, and why (for ``Communicator.describe`` and the debug log)."""

    algorithm: str
    codec: Compressor
    reason: str


def choose(
    collective: str, nbytes: int, codec: Compressor, transport: str, link: str, size: int
) -> Choice:
    """The schedule and codec of an ``auto`` call of ``nbytes`` input bytes."""
    where = (transport, link)
    if not codec.lossless:
        ring_from = COMPRESSED_RING_FROM.get(where)
        if (
            collective == "allreduce"
            and size == 2
            and ring_from is not None
            and nbytes >= ring_from
        ):
            return Choice(
                "ring", codec, f"{codec.codec_id} as asked; on 2 ranks the ring measured "
                f"faster from {ring_from} bytes on {transport}/{link}",
            )  # fmt: skip
        return Choice("two_shot", codec, f"{codec.codec_id} as asked, two-shot schedule")
    if size == 1:
        return Choice("native", _IDENTITY, "one rank: nothing to exchange")
    two_shot_from = IDENTITY_TWO_SHOT_FROM.get(where)
    if collective == "allreduce" and two_shot_from is not None and nbytes >= two_shot_from:
        return Choice(
            "two_shot", _IDENTITY, f"uncompressed two-shot measured faster than {transport}'s "
            f"own from {two_shot_from} bytes on {link}",
        )  # fmt: skip
    return Choice("native", _IDENTITY, f"identity: {transport}'s own collective on {link}")
