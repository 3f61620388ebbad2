"""The measuring half of ``coccl-bench tp-step`` (``tp_step.py`` is the command): the
process groups of the arms, the timed steps, and one record per (model, seq).

Every rank of the job runs this; MPI (the bench's launcher) gathers the ranks' figures,
``torch.distributed`` (initialized from MPI's world by ``coccl.torch.init_process_group``)
carries the blocks' AllReduces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import coccl.torch
from coccl.torch import CocclOptions

from . import tp_predict
from .cli import datatype
from .codec import HostDevice, gpu_device
from .tp_model import AllReduceTimer, TPStack, allreduces_per_step
from .tp_shapes import MODELS, SEED, Context, ModelShape


@dataclass
class Arm:
    """One process group of the run: the baseline (``compressor`` None) or a coccl one."""

    arm: str
    backend: str
    compressor: str | None
    compressor_config: dict[str, Any] | None
    group: Any  # this rank's TP group (None at TP = 1)

    def describe(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "backend": self.backend,
            "compressor": self.compressor,
            "compressor_config": self.compressor_config,
        }


def setup(mpi: Any, tp: int, args: argparse.Namespace) -> Context:
    """torch.distributed over MPI's world (a Gloo default group), this rank's GPU and
    thread count."""
    coccl.torch.init_process_group(backend="gloo")
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device("cpu")
    if args.device == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("--device gpu: torch sees no CUDA GPU")
        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        _use_cupy_device(local)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    default = "bfloat16" if args.device == "gpu" else "float32"
    dtype = getattr(torch, args.dtype or default)
    return Context(mpi, mpi.Get_rank(), mpi.Get_size(), tp, device, dtype)


def _use_cupy_device(index: int) -> None:
    """Make CuPy's current GPU torch's, so that the codec timings of ``--tp 1`` run there."""
    try:
        import cupy as cp  # noqa: PLC0415
    except ImportError:  # the coccl groups then say that they carry no CUDA tensors
        return
    cp.cuda.Device(index).use()


def _tp_group(ctx: Context, backend: str, options: CocclOptions | None = None) -> Any:
    """This rank's TP group of ``backend`` (consecutive ranks); every rank creates all."""
    mine = None
    for first in range(0, ctx.world, ctx.tp):
        ranks = list(range(first, first + ctx.tp))
        kwargs = {"pg_options": options} if options is not None else {}
        group = dist.new_group(ranks, backend=backend, **kwargs)
        if ctx.rank in ranks:
            mine = group
    return mine


def make_arms(ctx: Context, args: argparse.Namespace) -> list[Arm]:
    """The baseline and one coccl arm per ``--compressor``, each group created once."""
    base = "nccl" if args.device == "gpu" else "gloo"
    if ctx.tp == 1:  # nothing to reduce: one arm, no group (predictions name the others)
        return [Arm("tp1", "none", None, None, None)]
    arms = [Arm(base, base, None, None, _tp_group(ctx, base))]
    for spec in args.compressor:
        options = CocclOptions(
            compressor=spec.codec.get_config(),
            algorithm=args.algorithm,
            min_compress_bytes=args.min_compress_bytes,
        )
        group = _tp_group(ctx, "coccl", options)
        config = options.codec.get_config()
        arms.append(Arm(f"coccl:{spec.label}", "coccl", spec.label, config, group))
    return arms


def teardown() -> None:
    dist.destroy_process_group()


# ------------------------------------------------------------------- measuring
@dataclass
class Steps:
    """One rank's timed steps of one arm, and what the last one computed."""

    step_s: list[float]
    comm_s: list[float]
    calls: int
    nbytes: int
    out: torch.Tensor
    grad: torch.Tensor
    finite: bool


def _inputs(ctx: Context, shape: ModelShape, b: int, seq: int) -> tuple[torch.Tensor, ...]:
    """The block's input (replicated: the same on every rank) and output gradient."""
    gen = torch.Generator(device=ctx.device).manual_seed(SEED)
    size = (b, seq, shape.hidden)
    x = torch.randn(size, generator=gen, device=ctx.device).to(ctx.dtype)
    dy = torch.randn(size, generator=gen, device=ctx.device).to(ctx.dtype)
    return x.requires_grad_(True), dy


def time_steps(
    ctx: Context, args: argparse.Namespace, stack: TPStack, timer: AllReduceTimer | None, seq: int
) -> Steps:
    """``--warmup`` untimed and ``--steps`` timed forward + backward steps of ``stack``."""
    x, dy = _inputs(ctx, stack.blocks[0].shape, args.micro_batch, seq)
    params = list(stack.parameters())
    step_s: list[float] = []
    comm_s: list[float] = []
    out = x
    for i in range(args.warmup + args.steps):
        x.grad = None
        for p in params:
            p.grad = None
        if timer is not None:
            timer.reset()
        ctx.sync()
        ctx.mpi.Barrier()
        start = time.perf_counter()
        out = stack(x)
        out.backward(dy)
        ctx.sync()
        if i >= args.warmup:
            step_s.append(time.perf_counter() - start)
            comm_s.append(timer.seconds() if timer is not None else 0.0)
    grads = [x.grad, *(p.grad for p in params)]
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    calls = timer.calls if timer is not None else 0
    nbytes = timer.bytes if timer is not None else 0
    return Steps(step_s, comm_s, calls, nbytes, out.detach(), x.grad.detach(), finite)


def _stack(ctx: Context, args: argparse.Namespace, shape: ModelShape, tp: int, rank: int, timer):
    return TPStack(
        args.layers, timer, shape=shape, tp=tp, rank=rank, dtype=ctx.dtype, device=ctx.device,
        seed=SEED,
    )  # fmt: skip


def arm_record(
    ctx: Context,
    args: argparse.Namespace,
    arm: Arm,
    steps: Steps,
    base: Steps,
    seq: int,
    calls: dict[str, int] | None,
) -> dict[str, Any]:
    """The arm's figures: the slowest rank's medians (gathered over MPI), the comparison
    of its output with the baseline's on every rank (worst rank)."""
    # the median step and its own split (two middle steps averaged), so that
    # compute + comm == step as bench/SCHEMA.md defines them
    order = sorted(range(len(steps.step_s)), key=steps.step_s.__getitem__)
    mid = order[(len(order) - 1) // 2 : len(order) // 2 + 1]
    step = statistics.fmean(steps.step_s[i] for i in mid)
    comm = statistics.fmean(steps.comm_s[i] for i in mid)
    compute = step - comm
    diff = float((steps.out.float() - base.out.float()).abs().max())
    grad_diff = float((steps.grad.float() - base.grad.float()).abs().max())
    per_rank = ctx.mpi.allgather((step, comm, compute, diff, grad_diff, steps.finite))
    slowest = max(range(len(per_rank)), key=lambda r: per_rank[r][0])
    step, comm, compute = per_rank[slowest][:3]
    medians = [r[0] for r in per_rank]
    ms = {"rank0": medians[0], "avg": statistics.fmean(medians), "min": min(medians)}
    ms["max"] = max(medians)
    tokens = args.micro_batch * seq
    return {
        **arm.describe(),
        "step_ms": step * 1e3,
        "compute_ms": compute * 1e3,
        "comm_ms": comm * 1e3,
        "step_ms_ranks": {k: v * 1e3 for k, v in ms.items()},
        "slowest_rank": slowest,
        "tokens_per_s": tokens / step,
        "speedup": None,  # filled in against the baseline's
        "allreduce_calls": steps.calls,
        "allreduce_bytes": steps.nbytes,
        "calls": calls,
        "output_sum": float(steps.out.double().sum()),
        "input_grad_norm": float(steps.grad.double().norm()),
        "output_max_abs": float(steps.out.float().abs().max()),
        "output_max_abs_diff": max(r[3] for r in per_rank),
        "input_grad_max_abs_diff": max(r[4] for r in per_rank),
        "finite": all(r[5] for r in per_rank),
    }


def _stats(arm: Arm) -> dict[str, int] | None:
    """A coccl group's calls so far by path (``allreduce:compressed``...); None for others."""
    return arm.group.stats() if arm.backend == "coccl" else None


def measure_run(
    ctx: Context, args: argparse.Namespace, arms: list[Arm], name: str, seq: int
) -> dict[str, Any]:
    """Every arm at one (model, seq); with TP = 1 also the TP = 2 prediction."""
    shape = MODELS[name]
    tokens = args.micro_batch * seq
    message = tokens * shape.hidden * torch.empty((), dtype=ctx.dtype).element_size()
    per_step = allreduces_per_step(args.layers)
    records, base = [], None
    for arm in arms:
        timer = AllReduceTimer(arm.group, ctx.device) if arm.group is not None else None
        stack = _stack(ctx, args, shape, ctx.tp, ctx.tp_rank, timer)
        before = _stats(arm)
        steps = time_steps(ctx, args, stack, timer, seq)
        del stack
        calls = _stats(arm)
        if calls is not None:  # this run's calls alone
            calls = {k: n - before.get(k, 0) for k, n in calls.items() if n > before.get(k, 0)}
        if base is None:  # the first arm is the baseline
            base = steps
        records.append(arm_record(ctx, args, arm, steps, base, seq, calls))
    for record in records:
        record["speedup"] = records[0]["step_ms"] / record["step_ms"]
    run = {
        "model": {
            "name": shape.name,
            "hidden": shape.hidden,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "ffn": shape.ffn,
            "gated": shape.gated,
            "source": shape.source,
        },  # fmt: skip
        "seq": seq,
        "tokens": tokens,
        "message_bytes": message,
        "allreduces_per_step": per_step,
        "arms": records,
        "codec_costs": [],
        "predictions": [],
        "prediction_model": None,
    }
    if ctx.tp == 1 and shape.problem(tp_predict.PREDICT_TP) is None:
        calls = sum(per_step.values())
        run.update(_prediction(ctx, args, shape, seq, message, calls, records[0]["step_ms"]))
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return run


def _prediction(
    ctx: Context,
    args: argparse.Namespace,
    shape: ModelShape,
    seq: int,
    message: int,
    calls: int,
    tp1_step_ms: float,
) -> dict[str, Any]:
    """The compute of rank 0's TP = 2 shard, the codecs' costs, the predicted steps."""
    stack = _stack(ctx, args, shape, tp_predict.PREDICT_TP, 0, None)
    steps = time_steps(ctx, args, stack, None, seq)
    del stack
    compute_s = max(ctx.mpi.allgather(statistics.median(steps.step_s)))
    links = tp_predict.load_links(args.links)
    planned = [{"arm": "nccl", "compressor": None, "compressor_config": None}]
    for spec in args.compressor:
        config = spec.codec.get_config()
        planned.append({"arm": f"coccl:{spec.label}", "compressor": spec.label,
                        "compressor_config": config})  # fmt: skip
    dtype = str(ctx.dtype).removeprefix("torch.")
    predictions = tp_predict.predict(
        links, planned, args.algorithm, dtype, message, calls, compute_s, args.micro_batch * seq
    )
    device = gpu_device() if ctx.device.type == "cuda" else HostDevice()
    count = message // torch.empty((), dtype=ctx.dtype).element_size()
    costs = tp_predict.codec_costs(
        device, args.compressor, datatype(dtype), count, calls, args.steps, args.warmup
    )
    return {
        "codec_costs": tp_predict.as_dicts(costs),
        "predictions": tp_predict.as_dicts(predictions),
        "prediction_model": {
            "kind": "prediction",
            "tp": tp_predict.PREDICT_TP,
            "model": tp_predict.MODEL,
            "compute_ms": compute_s * 1e3,
            "tp1_step_ms": tp1_step_ms,
            "links_file": str(args.links),
            "links_what": links.get("what"),
            "links_date": links.get("date"),
            "links_gpu": links.get("gpu"),
        },
    }
