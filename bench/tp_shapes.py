"""The transformer widths ``coccl-bench tp-step --model`` names (no torch here: the
command's flags are parsed, and ``--np`` relaunches, without importing it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """A transformer width.

    Attributes:
        name: the ``--model`` name.
        hidden: the model width.
        heads: query heads.
        kv_heads: key/value heads (fewer than ``heads``: grouped-query attention).
        ffn: the MLP's hidden units.
        gated: a SwiGLU MLP (gate and up projections, SiLU) instead of GELU.
        source: where the shape comes from.
    """

    name: str
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    gated: bool
    source: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def problem(self, tp: int) -> str | None:
        """What keeps this shape from splitting over ``tp`` ranks, or None."""
        for what, value in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if value % tp:
                return f"--model {self.name}: {what}={value} does not split over --tp {tp}"
        return None


MODELS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("tiny", 64, 4, 4, 256, False, "a test width"),
        ModelShape("gpt-2.7b", 2560, 32, 32, 10240, False, "GPT-3 2.7B (Brown et al., 2020)"),
        ModelShape("gpt-6.7b", 4096, 32, 32, 16384, False, "GPT-3 6.7B (Brown et al., 2020)"),
        ModelShape("gpt-13b", 5120, 40, 40, 20480, False, "GPT-3 13B (Brown et al., 2020)"),
        ModelShape(
            "qwen2.5-7b",
            3584,
            28,
            4,
            18944,
            True,
            "Qwen2.5-7B's config.json (GQA, SwiGLU; its QKV biases and RMSNorm taken as "
            "bias-free projections and LayerNorm)",
        ),  # fmt: skip
    )
}


SEED = 20240917  # of the weights, the input and the output gradient


@dataclass(frozen=True)
class Context:
    """Where this rank runs."""

    mpi: Any
    rank: int
    world: int
    tp: int
    device: Any  # torch.device
    dtype: Any  # torch.dtype

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    def sync(self) -> None:
        import torch  # noqa: PLC0415

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
