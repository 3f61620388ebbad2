"""The DDP communication hook (coccl/torch/comm_hooks.py): its residual moves on one
process, and tests/scripts/torch_ddp_cases.py on 2 CPU ranks under torchrun."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from test_torch_backend import run_cases  # noqa: E402

import coccl  # noqa: E402
from coccl.torch import CocclHookState  # noqa: E402
from coccl.torch.comm_hooks import assemble, residual_pieces  # noqa: E402

CASES = "tests/scripts/torch_ddp_cases.py"


class FakeBucket:
    """What the hook reads of DDP's GradBucket: index() and parameters()."""

    def __init__(self, index: int, params: list[torch.Tensor]) -> None:
        self._index, self._params = index, params

    def index(self) -> int:
        return self._index

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def test_rebuilt_buckets_keep_every_residual():
    """Two buckets (a, b) and (c) rebuilt as (c, a) and (b): each parameter's residual
    lands in its new place, none is dropped or zeroed."""
    a, b, c = torch.zeros(3), torch.zeros(2), torch.zeros(4)
    state = CocclHookState(compressor="int8", feedback=True)
    first = state.feedback_for(FakeBucket(0, [a, b]))
    second = state.feedback_for(FakeBucket(1, [c]))
    first.residual = np.arange(5, dtype=np.float32)  # as a call would leave it
    second.residual = np.arange(10, 14, dtype=np.float32)
    assert state.feedback_for(FakeBucket(0, [a, b])) is first  # same layout: same state
    new0 = state.feedback_for(FakeBucket(0, [c, a]))
    new1 = state.feedback_for(FakeBucket(1, [b]))
    assert state.rebuilds == 1
    np.testing.assert_array_equal(new0.residual, [10, 11, 12, 13, 0, 1, 2])
    np.testing.assert_array_equal(new1.residual, [3, 4])


def test_residual_helpers_zero_a_parameter_without_one():
    moved = {1: np.ones(2, np.float32)}
    out = assemble(moved, (1, 2), (2, 3))
    np.testing.assert_array_equal(out, [1, 1, 0, 0, 0])
    assert moved == {}
    fb = coccl.Feedback()
    assert residual_pieces([]) == {}
    assert fb.residual is None


def test_feedback_with_an_exact_codec_is_refused():
    with pytest.raises(ValueError, match="lossy"):
        CocclHookState(compressor="identity", feedback=True)


@pytest.mark.launch
def test_ddp_cases_under_torchrun(tmp_path: Path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run_cases([*torchrun, "--nproc-per-node", "2"], tmp_path, CASES)
