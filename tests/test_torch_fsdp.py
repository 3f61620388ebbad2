"""FSDP2's comm objects over coccl (coccl/torch/fsdp.py): their arguments checked here,
and tests/scripts/torch_fsdp_cases.py on 2 ranks under torchrun (exact comms bitwise
FSDP2's own, the delta gather, the feedback reduce, a lossy traffic over Gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_torch_p2p import run_cases  # noqa: E402

from coccl.torch import Traffic, fsdp_comms, shard_comms  # noqa: E402

INT4 = {"id": "int", "bits": 4, "group_size": 32}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"gather": Traffic(INT4, state="feedback")}, ValueError, "gather takes state"),
        ({"reduce": Traffic(INT4, state="delta")}, ValueError, "reduce takes state"),
        ({"gather": Traffic({"id": "identity"}, state="delta")}, ValueError, "needs a lossy"),
        ({"reduce": {"id": "int8"}}, TypeError, "must be a coccl.torch.Traffic"),
    ],
)
def test_bad_traffic_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        fsdp_comms(**kwargs)


def test_shard_comms_needs_a_sharded_module():
    with pytest.raises(TypeError, match="call fully_shard"):
        shard_comms(torch.nn.Linear(2, 2))


def test_a_codec_pair_needs_the_hierarchical_schedule():
    pair = ({"id": "int8"}, INT4)
    gather, reduce = fsdp_comms(reduce=Traffic(pair, "hierarchical"))
    assert reduce.lossy and not gather.lossy
    with pytest.raises(ValueError, match="pair .* is for schedule 'hierarchical'"):
        Traffic(pair, "two_shot")


def test_each_pair_keeps_its_own_state():
    a, b = fsdp_comms(Traffic(INT4, state="delta")), fsdp_comms(Traffic(INT4, state="delta"))
    assert a[0].delta is not b[0].delta and a[1].feedback is None


@pytest.mark.launch
def test_fsdp_cases_under_torchrun(tmp_path: Path):
    run_cases("tests/scripts/torch_fsdp_cases.py", 2, tmp_path)
