"""Real tensors for ``coccl-bench fidelity --tensors``: train the repo's GPT briefly on the
CPU, then capture what each kind of parallel training would send, in one ``.npz``.

    python examples/capture_tensors.py --out /tmp/gpt-tensors.npz          # about 3 min
    coccl-bench fidelity --tensors /tmp/gpt-tensors.npz --compressor tah:row=256,taco,int8

The model is ``tp_gpt.GPT`` (a pre-LayerNorm byte-level GPT), trained in float32 with
``tp_gpt``'s AdamW and learning-rate schedule on the Python standard library's sources
(``stdlib_corpus.py``: distinct windows in a seeded order). The last training step is
the captured one: hooks record its forward and backward, then its optimizer update.
Every array is float32:

* ``pp_act.after_blockI``: the residual stream leaving block ``I`` (``[tokens, d_model]``),
  what a pipeline stage ending there sends forward; ``pp_grad.after_blockI``: its
  gradient, what the next stage sends back.
* ``tp_fwd.blockI.attn_proj`` / ``tp_fwd.blockI.mlp_fc2``: rank 0's partial product of
  a row-parallel linear at TP = ``--tp`` (its slice of the input times its slice of the
  weight, no bias), the input of a forward TP AllReduce; ``tp_bwd.blockI.mlp_fc1``: rank
  0's partial input gradient of the column-parallel ``fc1``, the input of a backward one.
* ``dp_grad.bucket``: every parameter's gradient, flattened in ``model.parameters()``
  order into one vector, as a data-parallel gradient bucket; ``weights.all``: the
  weights before the step, flattened likewise; ``weights.delta``: the step's update
  (weights after minus before), what a weight-delta AllGather sends.

A ``__meta__`` entry (a JSON string) holds the configuration, the losses, the corpus's
digest, the command, and the SHA-256 of every array. With ``--threads 1`` (the default) a
run is deterministic: the same command gives the same bytes on the same torch build.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the sibling example modules, also when imported by tests
    sys.path.insert(0, str(HERE))

import stdlib_corpus  # noqa: E402
import tp_gpt  # noqa: E402
from run_convergence import git_commit  # noqa: E402

META_KEY = "__meta__"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--out", type=Path, required=True, help="the .npz to write")
    add("--steps", type=int, default=300, help="training steps, the last one captured")
    add("--seed", type=int, default=1234, help="initial weights and data order")
    add("--layers", type=int, default=4, help="transformer blocks")
    add("--d-model", type=int, default=256, help="model width")
    add("--heads", type=int, default=8, help="attention heads")
    add("--seq", type=int, default=128, help="context length in bytes")
    add("--batch", type=int, default=16, help="sequences per step")
    add("--lr", type=float, default=3e-3, help="peak learning rate")
    add("--tp", type=int, default=2, help="TP size whose rank-0 partials are captured")
    add("--val-batches", type=int, default=8, help="validation batches at the end")
    add("--log-every", type=int, default=50, help="steps between training-loss lines")
    add("--threads", type=int, default=1, help="torch threads (1: deterministic)")
    add("--corpus-root", type=Path, help="another folder of .py files (default: the stdlib)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    if args.heads % args.tp or (4 * args.d_model) % args.tp:
        p.error(f"--tp {args.tp} must divide the heads ({args.heads}) and 4 * d_model")
    return args


class Capture:
    """Hooks on one step of a :class:`tp_gpt.GPT`: the residual stream between blocks and
    its gradient, and rank 0's TP partials; :meth:`arrays` hands them out as numpy."""

    def __init__(self, model: tp_gpt.GPT, tp: int) -> None:
        self.tp = tp
        self.tensors: dict[str, torch.Tensor] = {}
        self.handles: list[Any] = []
        for i, block in enumerate(model.blocks):
            if i + 1 < len(model.blocks):  # a stage boundary: another block follows
                self.handles.append(block.register_forward_hook(self._boundary(i)))
            self._row_parallel(block.attn.proj, f"tp_fwd.block{i}.attn_proj")
            self._row_parallel(block.mlp.fc2, f"tp_fwd.block{i}.mlp_fc2")
            self._column_parallel(block.mlp.fc1, f"tp_bwd.block{i}.mlp_fc1")

    def _boundary(self, i: int) -> Any:
        def hook(_module: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
            self.tensors[f"pp_act.after_block{i}"] = out.detach().clone()

            def grad_hook(grad: torch.Tensor) -> None:
                self.tensors[f"pp_grad.after_block{i}"] = grad.detach().clone()

            out.register_hook(grad_hook)

        return hook

    def _row_parallel(self, linear: nn.Linear, name: str) -> None:
        """Rank 0 holds the first ``in / tp`` input columns: its partial is its slice of
        the input times that slice of the weight (the bias is added after the reduce)."""
        k = linear.in_features // self.tp

        def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            with torch.no_grad():
                self.tensors[name] = inputs[0][..., :k] @ linear.weight[:, :k].T

        self.handles.append(linear.register_forward_pre_hook(hook))

    def _column_parallel(self, linear: nn.Linear, name: str) -> None:
        """Rank 0 holds the first ``out / tp`` output rows: its partial input gradient is
        its slice of the output gradient times those rows of the weight."""
        k = linear.out_features // self.tp

        def hook(_module: nn.Module, _grad_in: Any, grad_out: tuple[torch.Tensor, ...]) -> None:
            with torch.no_grad():
                self.tensors[name] = grad_out[0][..., :k] @ linear.weight[:k]

        self.handles.append(linear.register_full_backward_hook(hook))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def arrays(self) -> dict[str, np.ndarray]:
        """Every captured tensor as float32 ``[tokens, width]``, sorted by name."""
        return {
            name: t.reshape(-1, t.shape[-1]).to(torch.float32).numpy()
            for name, t in sorted(self.tensors.items())
        }


def flat(tensors: list[torch.Tensor]) -> np.ndarray:
    """The tensors flattened and concatenated, as float32 numpy."""
    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float32).numpy()


def describe(args: argparse.Namespace) -> dict[str, str]:
    """What each kind of captured array stands for (the record's ``tensors`` field)."""
    tokens = f"[{args.batch * args.seq}, {args.d_model}]"
    return {
        "pp_act.*": f"residual stream leaving a block {tokens}: a PP stage's forward send",
        "pp_grad.*": f"its gradient {tokens}: a PP stage's backward send",
        "tp_fwd.*": f"rank 0's row-parallel partial product at TP={args.tp} {tokens}: "
        "a forward TP AllReduce input",
        "tp_bwd.*": f"rank 0's column-parallel partial input gradient at TP={args.tp} "
        f"{tokens}: a backward TP AllReduce input",
        "dp_grad.bucket": "every parameter's gradient, flattened: a DP gradient bucket",
        "weights.all": "every weight before the step, flattened",
        "weights.delta": "the step's AdamW update (after - before), flattened: "
        "what a weight-delta AllGather sends",
    }


def train_and_capture(
    args: argparse.Namespace, log: Any
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Train ``args.steps`` steps, capturing the last; the arrays and what the run was."""
    corpus = stdlib_corpus.load_stdlib_corpus(args.corpus_root)
    windows = stdlib_corpus.train_windows(corpus.train, args.seq, args.batch, args.steps, args.seed)
    val = stdlib_corpus.val_windows(corpus.val, args.seq, args.batch, args.val_batches)
    cfg = tp_gpt.GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    torch.manual_seed(args.seed)
    model = tp_gpt.GPT(cfg)
    params = list(model.parameters())
    opt = tp_gpt.make_optimizer(model, args.lr)
    log(f"[capture] {sum(p.numel() for p in params) / 1e6:.2f} M parameters, {cfg}")

    began, cpu_began = time.perf_counter(), time.process_time()
    losses: list[dict[str, float]] = []
    arrays: dict[str, np.ndarray] = {}
    for step in range(args.steps):
        last = step + 1 == args.steps
        for g in opt.param_groups:
            g["lr"] = tp_gpt.lr_at(step, args.steps, args.lr)
        xy = torch.from_numpy(windows[step].astype(np.int64))
        capture = Capture(model, args.tp) if last else None
        loss = F.cross_entropy(model(xy[:, :-1]).flatten(0, 1), xy[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if capture is not None:
            capture.remove()
            arrays.update(capture.arrays())
            arrays["dp_grad.bucket"] = flat([p.grad for p in params])
            arrays["weights.all"] = before = flat(params)
        opt.step()
        if capture is not None:
            arrays["weights.delta"] = flat(params) - before
        if (step + 1) % args.log_every == 0 or last:
            losses.append({"step": step + 1, "train_loss": loss.item()})
            log(f"[capture] step {step + 1:5d}  train {loss.item():.4f}")
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    val_loss = tp_gpt.evaluate(
        model, [(torch.from_numpy(v[:, :-1].astype(np.int64)),
                 torch.from_numpy(v[:, 1:].astype(np.int64))) for v in val]
    )  # fmt: skip
    log(f"[capture] final validation loss {val_loss:.4f}; training: {wall:.0f} s, {cpu:.0f} s CPU")
    run = {
        "model": {**cfg.__dict__, "params": sum(p.numel() for p in params)},
        "steps": args.steps,
        "captured_step": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seed": args.seed,
        "tp": args.tp,
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        "train_loss": losses[-1]["train_loss"],
        "val_loss": val_loss,
        "val_batches": args.val_batches,
        "losses": losses,
        "train_wall_s": wall,
        "train_cpu_s": cpu,
        "corpus": corpus.info,
    }
    return arrays, run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    arrays, run = train_and_capture(args, log)
    commit, dirty = git_commit()
    meta = {
        "what": "examples/capture_tensors.py: tensors of one training step of tp_gpt.GPT",
        "command": shlex.join(
            ["python", "examples/capture_tensors.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "commit_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        **run,
        "tensors": describe(args),
        "arrays": {
            name: {
                "shape": list(a.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
            }
            for name, a in arrays.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays, **{META_KEY: np.array(json.dumps(meta))})
    size = args.out.stat().st_size
    log(f"[capture] {len(arrays)} arrays written to {args.out} ({size / 2**20:.1f} MiB)")
    print(json.dumps({k: meta[k] for k in ("model", "steps", "train_loss", "val_loss")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
