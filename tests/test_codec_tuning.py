"""The GPU kernels' public tuning hooks (set_tuning, tuning, get_tuning): their bookkeeping
needs no GPU (test_codec_gpu.py runs kernels under them)."""

from __future__ import annotations

import pytest

from coccl.compressors import gpu_kernels as gk


def test_set_tuning_returns_what_restores_it() -> None:
    before = gk.get_tuning()
    previous = gk.set_tuning(threads=128, stage=1, resident={"encode": 512})
    try:
        now = gk.get_tuning()
        assert now["threads"] == 128
        assert set(now["stage"].values()) == {1}  # one value: every kernel kind
        assert now["resident"] == {**before["resident"], "encode": 512}  # a dict: those kinds
        assert previous == {k: before[k] for k in ("threads", "stage", "resident")}
    finally:
        gk.set_tuning(**previous)
    assert gk.get_tuning() == before


def test_tuning_context_manager_restores_on_exit_and_on_error() -> None:
    before = gk.get_tuning()
    with gk.tuning(encode_epl=0, sw_cvt=True) as inside:
        assert inside["encode_epl"] == 0 and inside["sw_cvt"] == 1
        assert gk.get_tuning() == inside
    assert gk.get_tuning() == before
    with pytest.raises(RuntimeError, match="boom"), gk.tuning(blocks_per_sm=2):
        raise RuntimeError("boom")
    assert gk.get_tuning() == before


def test_get_tuning_is_a_copy() -> None:
    t = gk.get_tuning()
    t["threads"] = 32
    t["stage"]["decode"] = 0
    assert gk.get_tuning() != t


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"bogus": 1}, "unknown tuning key"),
        ({"threads": 100}, "threads"),
        ({"threads": 2048}, "threads"),
        ({"epl_threads": 16}, "epl_threads"),
        ({"encode_epl": 48}, "encode_epl"),
        ({"hop_epl": 16}, "hop_epl"),
        ({"hop_epl_from": -1}, "hop_epl_from"),
        ({"stage": 2}, "stage"),
        ({"stage": {"reduce": 1}}, "unknown kernel kinds"),
        ({"resident": {"encode": 0}}, "resident"),
        ({"blocks_per_sm": 1.5}, "blocks_per_sm"),
        ({"threads": 128, "sw_cvt": 3}, "sw_cvt"),  # refused whole: threads stays
    ],
)
def test_bad_tuning_is_refused_before_any_change(changes: dict, message: str) -> None:
    before = gk.get_tuning()
    with pytest.raises(ValueError, match=message):
        gk.set_tuning(**changes)
    assert gk.get_tuning() == before
