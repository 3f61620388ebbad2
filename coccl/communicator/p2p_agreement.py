"""Point-to-point agreement: what both ends of a message must agree on, and the tags
its messages travel under.

Messages between two ranks pair in the order they are posted, one sequence per
(peer, direction), on both sides (as NCCL pairs them; the user's tag is checked, not
used for matching). Every message opens with a small exchange of the two ends'
signatures (count, dtype, codec config, tag, chunking, wire): the sender's goes with its
data, the receiver's back at once; the receiver posts its data receives only once the
sender's signature matches its own, and each end raises ``CocclError`` naming what
differs if it does not, so a mismatch is never a wrong decode, and never a hang.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from coccl.errors import CocclError

# The tags of one message: its signature (sender -> receiver), the receiver's signature
# (receiver -> sender), then one per chunk, modulo the chunk slots.
SLOTS_PER_MESSAGE = 64
HEADER_SLOTS = 2
CHUNK_SLOTS = SLOTS_PER_MESSAGE - HEADER_SLOTS
# The engine keeps fewer rounds of one message in flight than it has chunk slots, so the
# chunks that share a tag are always posted in the same order on both ends.
MAX_DEPTH = CHUNK_SLOTS - 1
SIGNATURE_BYTES = 512  # the longest codec config's signature takes about half
GUARANTEED_TAG_UB = 32767  # MPI guarantees tags up to 32767


def window(tag_ub: int) -> int:
    """How many messages of one (peer, direction) may be in flight at once: each takes
    ``SLOTS_PER_MESSAGE`` tags of the transport's ``0..tag_ub``."""
    return max(1, min(4096, (tag_ub + 1) // SLOTS_PER_MESSAGE))


def tag_of(seq: int, slot: int, slots: int) -> int:
    """The transport tag of slot ``slot`` of the message numbered ``seq``; ``slots``
    messages in flight (``window``) never share one."""
    return (seq % slots) * SLOTS_PER_MESSAGE + slot


def chunk_slot(chunk: int) -> int:
    return HEADER_SLOTS + chunk % CHUNK_SLOTS


def signature(
    count: int, dtype: str, config: dict, tag: int, chunk_elems: int, wire: str = "mpi"
) -> dict:
    """What both ends of a message must agree on (JSON-serialisable). ``wire``: the
    transport of its data, ``"mpi"`` (host data, or device data through host copies) or
    ``"nccl"`` (device data on a communicator with NCCL): a host array cannot meet a
    device array there."""
    return {
        "count": count,
        "dtype": dtype,
        "compressor": config,
        "tag": tag,
        "chunk_elems": chunk_elems,
        "wire": wire,
    }


def encode_signature(sig: dict) -> np.ndarray:
    """``sig`` as a fixed-size byte buffer: its JSON length, then its JSON."""
    text = json.dumps(sig, sort_keys=True).encode()
    if len(text) > SIGNATURE_BYTES - 8:
        raise ValueError(
            f"the compressor's configuration is too long for a point-to-point signature "
            f"({len(text)} bytes of JSON, at most {SIGNATURE_BYTES - 8})"
        )
    buf = np.zeros(SIGNATURE_BYTES, dtype=np.uint8)
    buf[:8].view(np.int64)[0] = len(text)
    buf[8 : 8 + len(text)] = np.frombuffer(text, dtype=np.uint8)
    return buf


def decode_signature(buf: np.ndarray, peer: int) -> dict:
    """The signature in a buffer that ``encode_signature`` filled (CocclError if not)."""
    n = int(buf[:8].copy().view(np.int64)[0])
    try:
        if not 0 <= n <= SIGNATURE_BYTES - 8:
            raise ValueError(f"length {n}")
        sig = json.loads(buf[8 : 8 + n].tobytes())
    except ValueError as exc:
        raise CocclError(
            f"rank {peer} sent a malformed point-to-point signature ({exc}); do both ends "
            "run the same coccl?"
        ) from None
    return sig


def mismatch(sender: int, receiver: int, sent: dict, expected: dict) -> str | None:
    """Why a message's two ends disagree (the same text on both ends), or None."""
    keys = [k for k in sorted(set(sent) | set(expected)) if sent.get(k) != expected.get(k)]
    if not keys:
        return None
    detail = "; ".join(f"{k}: sender {sent.get(k)!r}, receiver {expected.get(k)!r}" for k in keys)
    return (
        f"point-to-point message from rank {sender} to rank {receiver}: the two ends do not "
        f"agree ({detail}); messages between two ranks pair in the order they are posted, "
        "so both ends must post the same messages in the same order"
    )


def check_tag(tag: Any) -> int:
    """ValueError unless ``tag`` is an integer (a bool is not one)."""
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise ValueError(f"tag must be an integer, got {tag!r}")
    return int(tag)


def agreed(sig: Any) -> Any:
    """``sig`` after a JSON roundtrip: what the peer decodes of it (tuples become lists)."""
    return json.loads(json.dumps(sig, sort_keys=True))
