"""Point-to-point agreement: what both ends of a message must agree on, and the tags
its messages travel under.

Messages between two ranks pair in the order they are posted, one sequence per
(peer, direction), on both sides (as NCCL pairs them; the user's tag is checked, not
used for matching). Every message opens with a small header each way: the digest of
its end's signature (count, dtype, codec config, tag, chunking, wire), and the signature
itself the first time that end uses it with that peer in that direction. Each end keeps
the signatures already agreed per (peer, direction), the same on both ends; one whole
agreement per new (peer, signature), as the collectives' first-call check: a receive of
a new signature posts its data receives only once the sender's header matches, a
receive of an agreed one posts them at once and decodes only once the header matches.
Digests that differ raise ``CocclError`` on both ends naming what differs (the header's
signature, or the agreed one its digest names), so a mismatch is never a wrong decode,
and never a hang.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from coccl.errors import CocclError

# The tags of one message: its header (sender -> receiver), the receiver's header
# (receiver -> sender), then one per chunk, modulo the chunk slots.
SLOTS_PER_MESSAGE = 64
HEADER_SLOTS = 2
CHUNK_SLOTS = SLOTS_PER_MESSAGE - HEADER_SLOTS
# The engine keeps fewer rounds of one message in flight than it has chunk slots, so the
# chunks that share a tag are always posted in the same order on both ends.
MAX_DEPTH = CHUNK_SLOTS - 1
HEADER_BYTES = 512  # the longest codec config's signature takes about half
DIGEST_BYTES = 20  # SHA-1 of the signature's canonical JSON
_JSON_AT = 8 + DIGEST_BYTES  # a header: JSON length (0: digest only), digest, JSON
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


@dataclass(frozen=True)
class Sealed:
    """A signature as it travels: its canonical JSON and that JSON's digest."""

    text: bytes
    digest: bytes

    def fields(self) -> dict:
        """The signature as the peer decodes it (tuples become lists)."""
        return json.loads(self.text)


def seal(sig: dict) -> Sealed:
    """``sig`` sealed for headers (ValueError if its JSON cannot fit one)."""
    text = json.dumps(sig, sort_keys=True).encode()
    if len(text) > HEADER_BYTES - _JSON_AT:
        raise ValueError(
            f"the compressor's configuration is too long for a point-to-point signature "
            f"({len(text)} bytes of JSON, at most {HEADER_BYTES - _JSON_AT})"
        )
    return Sealed(text, hashlib.sha1(text).digest())


def encode_header(sealed: Sealed, whole: bool) -> np.ndarray:
    """A fixed-size header: the digest, and the signature's JSON if ``whole``."""
    buf = np.zeros(HEADER_BYTES, dtype=np.uint8)
    n = len(sealed.text) if whole else 0
    buf[:8].view(np.int64)[0] = n
    buf[8:_JSON_AT] = np.frombuffer(sealed.digest, dtype=np.uint8)
    buf[_JSON_AT : _JSON_AT + n] = np.frombuffer(sealed.text[:n], dtype=np.uint8)
    return buf


def decode_header(buf: np.ndarray, peer: int) -> tuple[bytes, dict | None]:
    """The digest in a header that ``encode_header`` filled, and its signature if it
    carries one (CocclError if the bytes are no header)."""
    n = int(buf[:8].copy().view(np.int64)[0])
    digest = buf[8:_JSON_AT].tobytes()
    try:
        if not 0 <= n <= HEADER_BYTES - _JSON_AT:
            raise ValueError(f"length {n}")
        text = buf[_JSON_AT : _JSON_AT + n].tobytes()
        if n and hashlib.sha1(text).digest() != digest:
            raise ValueError("its digest is not its signature's")
        sig = json.loads(text) if n else None
    except ValueError as exc:
        raise CocclError(
            f"rank {peer} sent a malformed point-to-point header ({exc}); do both ends "
            "run the same coccl?"
        ) from None
    return digest, sig


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
