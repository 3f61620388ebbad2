"""Point-to-point agreement in one process (coccl/communicator/p2p_agreement.py): the
tags of messages that may be in flight together never meet, a header carries its
signature's digest (and the signature, when whole) through its bytes, and both ends name
a difference alike."""

import json

import numpy as np
import pytest

from coccl.communicator import p2p_agreement as agreement


@pytest.mark.parametrize("tag_ub", [agreement.GUARANTEED_TAG_UB, (1 << 29) - 1])
def test_messages_in_one_window_never_share_a_tag(tag_ub):
    slots = agreement.window(tag_ub)
    slot_ids = list(range(agreement.HEADER_SLOTS))
    slot_ids += [agreement.chunk_slot(c) for c in range(agreement.CHUNK_SLOTS)]
    assert len(set(slot_ids)) == agreement.SLOTS_PER_MESSAGE
    for first in (0, 7 * slots + 3):
        tags = {
            agreement.tag_of(s, k, slots) for s in range(first, first + slots) for k in slot_ids
        }
        assert len(tags) == slots * agreement.SLOTS_PER_MESSAGE
        assert min(tags) >= 0 and max(tags) <= tag_ub
    assert agreement.MAX_DEPTH < agreement.CHUNK_SLOTS


def test_a_header_carries_the_digest_and_the_signature_when_whole():
    sig = agreement.signature(5, "bfloat16", {"id": "taco", "group_size": 128}, -3, 1024)
    sealed = agreement.seal(sig)
    whole = agreement.encode_header(sealed, whole=True)
    short = agreement.encode_header(sealed, whole=False)
    assert whole.size == short.size == agreement.HEADER_BYTES
    assert agreement.decode_header(whole, 1) == (sealed.digest, sealed.fields())
    assert agreement.decode_header(short, 1) == (sealed.digest, None)
    assert sealed.fields() == json.loads(json.dumps(sig))
    other = agreement.seal(agreement.signature(6, "bfloat16", {"id": "taco"}, -3, 1024))
    assert other.digest != sealed.digest and len(sealed.digest) == agreement.DIGEST_BYTES


def test_a_signature_too_long_is_refused():
    with pytest.raises(ValueError, match="too long"):
        agreement.seal(agreement.signature(1, "float32", {"x": "y" * 2000}, 0, 1))


def test_garbage_is_not_a_header():
    buf = np.full(agreement.HEADER_BYTES, 255, np.uint8)
    with pytest.raises(Exception, match="malformed"):
        agreement.decode_header(buf, 3)
    # a signature whose digest is another's
    buf = agreement.encode_header(agreement.seal({"count": 1}), whole=True)
    buf[8] ^= 1
    with pytest.raises(Exception, match="malformed"):
        agreement.decode_header(buf, 3)


def test_both_ends_name_the_difference_alike():
    a = agreement.seal(agreement.signature(10, "float32", {"id": "identity"}, 0, 256)).fields()
    b = agreement.seal(agreement.signature(11, "float32", {"id": "identity"}, 1, 256)).fields()
    text = agreement.mismatch(0, 1, a, b)
    assert "count: sender 10, receiver 11; tag: sender 0, receiver 1" in text
    assert "from rank 0 to rank 1" in text
    assert agreement.mismatch(0, 1, a, a) is None
