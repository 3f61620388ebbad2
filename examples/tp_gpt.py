"""A small byte-level GPT trained with Megatron-style tensor parallelism on coccl.

Every TP rank sees the same batches; attention heads and the MLP's hidden units are
split across ranks (QKV and fc1 column-parallel, the output projection and fc2
row-parallel), while the embeddings, layer norms and LM head are replicated. Each
transformer block does two AllReduces forward and two backward, all through coccl with
the chosen algorithm and compressor.

The text is CPython's own ``pydoc_data.topics`` (the help pages of the language, about
half a megabyte of English that every Python installation ships); its last 10% is the
held-out validation split.

    # tensor parallel, 2 ranks, TACO on the wire
    mpiexec -n 2 python -m mpi4py examples/tp_gpt.py --tp-compressor taco --steps 300
    # the same 2 ranks simulated in one process (bitwise the run above, on CPU: by
    # default a rank gets cores / 2 torch threads in both)
    python examples/tp_gpt.py --virtual-tp 2 --tp-compressor taco --steps 300
    # the PyTorch-only single-process reference (same seed, data and steps)
    python examples/tp_gpt.py --baseline --steps 300

The full weights are drawn from ``--seed`` on every rank and then sliced, so the TP run
and the baseline start from the same model, and with ``--tp-compressor identity`` they
agree to float rounding. At the end, rank 0 prints one JSON line (also written to
``--out``) with the final validation loss and the loss history, after checking that
every replicated parameter is bitwise identical on all ranks (exit status 3 if not).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 256  # bytes
VAL_FRACTION = 0.1


# --------------------------------------------------------------------------- data
def load_text() -> np.ndarray:
    """The bytes of ``pydoc_data.topics``, topics in sorted order (a fixed corpus)."""
    from pydoc_data.topics import topics  # noqa: PLC0415

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def split(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation): the validation split is the corpus's last 10%."""
    cut = int(len(data) * (1 - VAL_FRACTION))
    return data[:cut], data[cut:]


def train_batches(
    data: np.ndarray, batch: int, seq: int, seed: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random windows of ``seq + 1`` bytes, from a generator of its own: the same order on
    every rank and in the baseline, whatever else draws random numbers."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq - 1, size=batch)
        yield _windows(data, starts, seq, device)


def val_batches(
    data: np.ndarray, batch: int, seq: int, count: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` fixed batches spread evenly over the validation split."""
    starts = np.linspace(0, len(data) - seq - 1, num=batch * count).astype(np.int64)
    return [_windows(data, s, seq, device) for s in starts.reshape(count, batch)]


def _windows(
    data: np.ndarray, starts: np.ndarray, seq: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(seq + 1)
    xy = torch.from_numpy(data[idx].astype(np.int64)).to(device)
    return xy[:, :-1], xy[:, 1:]


# -------------------------------------------------------------------------- model
@dataclass(frozen=True)
class GPTConfig:
    layers: int = 4
    d_model: int = 256
    heads: int = 8
    seq: int = 128
    mlp_ratio: int = 4


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention over a fused ``[q | k | v]`` projection.

    The head count is read off the projection's width, so the same code runs the full
    layer and a TP shard (whose ``qkv`` yields only its ranks's heads)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.heads
        self.qkv: nn.Module = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj: nn.Module = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        heads = q.shape[-1] // self.head_dim
        q, k, v = (z.view(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc1: nn.Module = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.fc2: nn.Module = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A pre-LayerNorm GPT-2-style decoder over bytes (no dropout: TP ranks and the
    baseline must compute the same function)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by heads={cfg.heads}")
        self.cfg = cfg
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if "ln" not in name:
                    nn.init.zeros_(p)  # biases; layer norms keep their ones and zeros
                continue
            std = residual_std if name.endswith(("proj.weight", "fc2.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def parallelize(model: GPT, group: Any, backward_group: Any = None) -> GPT:
    """Replace every block's linears by this rank's TP shards of them, in place.

    ``group`` is a :class:`coccl.tensor_parallel.TPGroup`, or a ``VirtualTPGroup``: then
    the layers hold every rank's shards and the model runs all ranks in this process.
    Heads and MLP hidden units must divide by the group size.

    ``backward_group`` (default: ``group``) carries the backward AllReduces: the
    column-parallel layers' (Megatron's *f*, the input gradients), while ``group`` keeps
    the row-parallel layers' forward ones (*g*, the activations). A column-parallel layer
    communicates only backward and a row-parallel one only forward, so the two
    directions can use different codecs. Both groups must be the same ranks: the same
    kind, size and rank.
    """
    from coccl.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: PLC0415

    cfg = model.cfg
    backward = group if backward_group is None else backward_group
    if type(backward) is not type(group) or backward.size != group.size:
        raise ValueError(
            f"backward_group ({type(backward).__name__} of {backward.size}) must be the same "
            f"kind and size as group ({type(group).__name__} of {group.size})"
        )
    if getattr(backward, "rank", None) != getattr(group, "rank", None):
        raise ValueError(f"backward_group is rank {backward.rank}, group rank {group.rank}")
    if cfg.heads % group.size:
        raise ValueError(f"heads={cfg.heads} is not divisible by the TP size {group.size}")
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        attn.qkv = ColumnParallelLinear.from_linear(attn.qkv, backward, blocks=3)
        attn.proj = RowParallelLinear.from_linear(attn.proj, group)
        mlp.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, backward)
        mlp.fc2 = RowParallelLinear.from_linear(mlp.fc2, group)
    return model


# ---------------------------------------------------------------------- training
def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup over the first 10% of steps (at most 100), then cosine to 10%."""
    warmup = max(1, min(100, steps // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_optimizer(
    model: nn.Module,
    lr: float | torch.Tensor,
    *,
    fused: bool | None = None,
    capturable: bool = False,
) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only. Elementwise, so a shard's update is exactly
    the slice of the unsharded update: no communication needed. ``fused`` picks
    PyTorch's fused kernels, which take a tensor ``lr``; ``capturable`` lets a CUDA graph
    capture the step."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused, capturable=capturable)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in batches]
    model.train()
    return float(np.mean(losses))


def replicated_digest(model: nn.Module) -> dict[str, str]:
    """SHA-256 of every parameter that all TP ranks should hold identically."""
    from coccl.tensor_parallel import is_tp_sharded  # noqa: PLC0415

    return {
        name: hashlib.sha256(p.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        for name, p in model.named_parameters()
        if not is_tp_sharded(p)
    }


def parse_compressor(spec: str) -> str | dict[str, Any]:
    """A JSON config dict, else the label as given (``taco``, ``taco:ash=false,group_size=64``:
    ``get_compressor`` reads labels)."""
    return json.loads(spec) if spec.lstrip().startswith("{") else spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--baseline", action="store_true", help="single process, plain PyTorch")
    p.add_argument(
        "--virtual-tp",
        type=int,
        default=0,
        metavar="N",
        help="single process simulating N TP ranks (coccl.tensor_parallel.VirtualTPGroup)",
    )
    p.add_argument("--tp-compressor", default="identity", help="name, name:k=v,... or JSON")
    p.add_argument("--tp-algorithm", default="two_shot", help="ring, two_shot, native, auto")
    p.add_argument("--backend", default="auto", help="coccl backend: auto, mpi, nccl")
    p.add_argument("--steps", type=int, default=300, help="training steps")
    p.add_argument("--seed", type=int, default=1234, help="initial weights and data order")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--d-model", type=int, default=256, help="model width")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--seq", type=int, default=128, help="context length in bytes")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--val-batches", type=int, default=8, help="batches per evaluation")
    p.add_argument("--log-every", type=int, default=25, help="steps between val evaluations")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to train")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of each rank (0: cores / TP ranks, in a virtual run as in a "
        "real one, so that the two sum alike)",
    )
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke configuration")
    p.add_argument("--out", type=Path, help="also write the result JSON here")
    args = p.parse_args(argv)
    if args.baseline and args.virtual_tp:
        p.error("--baseline and --virtual-tp exclude each other")
    if args.tiny:
        args.layers, args.d_model, args.heads, args.seq = 2, 64, 4, 32
        args.batch, args.val_batches = 4, 2
        args.log_every = min(args.log_every, max(1, args.steps))
    return args


def setup_tp(args: argparse.Namespace) -> tuple[Any, Any]:
    """(TPGroup, mpi4py COMM_WORLD) for a run under mpiexec."""
    from mpi4py import MPI  # noqa: PLC0415

    import coccl  # noqa: PLC0415
    from coccl.tensor_parallel import TPGroup  # noqa: PLC0415

    comm = coccl.init(MPI.COMM_WORLD, backend=args.backend)
    group = TPGroup(comm, args.tp_algorithm, parse_compressor(args.tp_compressor))
    return group, MPI.COMM_WORLD


def report(result: dict[str, Any], out: Path | None, identical: bool, prog: str) -> None:
    """Rank 0's end of a run: the result as one JSON line (and into ``out``), and an
    error line if the replicated parameters differ across TP ranks."""
    print(json.dumps(result), flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if not identical:
        print(f"[{prog}] ERROR: replicated parameters differ across TP ranks", file=sys.stderr)


def exit_now(code: int) -> NoReturn:
    """End this rank with ``code`` without the interpreter's finalization.

    ``destroy_process_group`` leaves torch's Gloo groups alive: Gloo's ``shutdown`` does
    nothing, and DTensor's cached shardings keep the meshes, whose groups hold the worker
    threads. A worker drops a finished collective's work, and with it the tensors,
    after ``wait()`` has returned, and dropping a tensor that Python also sees takes the
    GIL. If the interpreter is finalizing by then, Python 3.11 ends that thread with
    ``pthread_exit``, whose unwind through a ``noexcept`` destructor calls
    ``std::terminate`` ("terminate called without an active exception"): a rank whose
    work is done dies with SIGABRT. With no finalization there is no such moment. Output
    is flushed and MPI (under mpiexec) finalized first, as a normal exit would.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")  # imported when mpiexec launched this rank
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
        # MPICH tells its process manager of a clean exit from the C library's exit
        # handlers, which os._exit skips (hydra then kills the ranks still running). The
        # C exit, called holding the GIL, runs them and still no finalization: a Gloo
        # worker that wants the GIL from here on waits until the process is gone.
        ctypes.PyDLL(None).exit(code)
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    # torch's CPU sums depend on its thread count: a virtual run of N ranks gives each
    # rank's matmuls the threads a rank of a real N-rank run gets, so the two agree bitwise
    tp_ranks = args.virtual_tp or world
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // tp_ranks))
    if args.device == "cuda":
        # Same kernels every step and on every rank: replicas must stay bitwise equal.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        local = int(
            os.environ.get("MPI_LOCALRANKID", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        )
        torch.cuda.set_device(local % torch.cuda.device_count())
    device = (
        torch.device(args.device, torch.cuda.current_device())
        if args.device == "cuda"
        else torch.device("cpu")
    )

    group = mpi = None
    rank, tp = 0, 1
    if args.virtual_tp:
        import numba  # noqa: PLC0415

        from coccl.tensor_parallel import VirtualTPGroup  # noqa: PLC0415

        # numba's OpenMP threading layer shares the OpenMP runtime with torch, and starting
        # it resets the runtime's thread count: start it now, with as many threads as
        # torch, then give torch its count back (its sums depend on it).
        threads = torch.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        torch.set_num_threads(threads)
        compressor = parse_compressor(args.tp_compressor)
        group = VirtualTPGroup(args.virtual_tp, args.tp_algorithm, compressor)
        tp = group.size
    elif not args.baseline:
        group, mpi = setup_tp(args)
        rank, tp = group.rank, group.size

    cfg = GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    torch.manual_seed(args.seed)
    model = GPT(cfg)  # the full weights, the same on every rank and in the baseline
    n_params = sum(p.numel() for p in model.parameters())
    if group is not None:
        model = parallelize(model, group)
    model.to(device)
    opt = make_optimizer(model, args.lr)

    train, val = split(load_text())
    batches = train_batches(train, args.batch, cfg.seq, args.seed, device)
    val_set = val_batches(val, args.batch, cfg.seq, args.val_batches, device)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if rank == 0 else (lambda *a: None)
    mode = "baseline" if group is None else f"tp={tp} {args.tp_algorithm} {group.compressor!r}"
    if args.virtual_tp:
        mode = f"virtual {mode}"
    log(f"[tp_gpt] {mode}: {n_params / 1e6:.2f} M parameters, {cfg}")

    history: list[dict[str, float]] = []
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        x, y = next(batches)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last = step + 1 == args.steps
        if (step + 1) % args.log_every == 0 or last:
            val_loss = evaluate(model, val_set)
            history.append({"step": step + 1, "train_loss": loss.item(), "val_loss": val_loss})
            log(f"step {step + 1:5d}  train {loss.item():.4f}  val {val_loss:.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start

    identical = True
    n_replicated = 0
    if mpi is not None:
        digests = mpi.allgather(replicated_digest(model))
        n_replicated = len(digests[0])
        identical = all(d == digests[0] for d in digests)
    result = {
        "mode": "baseline" if group is None else ("virtual" if args.virtual_tp else "tp"),
        "tp": tp,
        "compressor": None if group is None else group.compressor.get_config(),
        "algorithm": None if group is None else args.tp_algorithm,
        "steps": args.steps,
        "seed": args.seed,
        "model": {**asdict(cfg), "params": n_params},
        "batch": args.batch,
        "lr": args.lr,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "val_loss": history[-1]["val_loss"] if history else None,
        "train_loss": loss.item(),
        "history": history,
        "wall_s": wall,
        "replicated_params": n_replicated,
        "replicated_identical": identical,
    }
    if rank == 0:
        report(result, args.out, identical, "tp_gpt")
    if mpi is not None:
        group.comm.close()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
