"""Tensor parallelism with PyTorch's own TP API over a coccl process group.

The repo's byte-level GPT (examples/tp_gpt.py's model, imported as it is) is parallelized
with ``parallelize_module``: in every block the fused QKV projection and fc1 are
``ColwiseParallel``, the attention output projection and fc2 ``RowwiseParallel``, over a
DeviceMesh whose group is a torch.distributed group of backend ``"coccl"``. DTensor then
issues the TP AllReduces (two forward, two backward per block) through torch's functional
collectives, which the coccl group runs with the codec it was created with.

One run trains the same model from the same seed and data once per group in ``--groups``
(``plain``: a Gloo group on CPU, NCCL on GPU; otherwise a coccl codec: ``identity``,
``taco``, ``int8``, ``taco:ash=false``..., optionally with a schedule: ``identity@native``
is NCCL's own AllReduce behind the coccl backend, ``taco@ring``), and reports each one's
loss history and throughput; ``identity``'s losses equal ``plain``'s to float rounding.

    # 2 CPU ranks (torchrun, or mpiexec: coccl.torch.init_process_group reads either)
    torchrun --nproc-per-node 2 examples/tp_dtensor.py --steps 20
    mpiexec -n 2 python -m mpi4py examples/tp_dtensor.py --steps 20 --tiny
    # 2 GPUs, bfloat16 autocast: plain NCCL against coccl identity and taco
    torchrun --nproc-per-node 2 examples/tp_dtensor.py --device cuda --dtype bfloat16

Rank 0 prints one JSON line (also written to ``--out``) with a record per group: losses,
median step time, tokens/s, the coccl group's call counts (how many AllReduces were
compressed) and whether the replicated parameters stayed bitwise identical on all ranks
(exit status 3 if not).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shlex
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_convergence import git_commit  # noqa: E402
from tp_gpt import (  # noqa: E402  (the model and data of the Megatron-style example)
    GPT,
    GPTConfig,
    exit_now,
    load_text,
    lr_at,
    parse_compressor,
    report,
    split,
    train_batches,
)

import coccl.torch  # noqa: E402

TINY_MIN_COMPRESS_BYTES = 4096  # --tiny: compress its 32 KiB TP messages


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--groups",
        default="plain,identity,taco",
        help="comma list: 'plain' (Gloo / NCCL) or a coccl codec (name, name:k=v,...), "
        "optionally with @algorithm (identity@native)",
    )
    p.add_argument("--algorithm", default="two_shot", help="coccl schedule of the TP calls")
    p.add_argument(
        "--min-compress-bytes",
        type=int,
        default=None,
        help="coccl groups run smaller messages exact (default: "
        f"{coccl.torch.DEFAULT_MIN_COMPRESS_BYTES}, coccl's; with --tiny "
        f"{TINY_MIN_COMPRESS_BYTES}, under its TP messages)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: autocast (parameters stay float32)")  # fmt: skip
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / ranks)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke configuration")
    p.add_argument("--out", type=Path, help="also write the result JSON here")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.d_model, args.heads, args.seq, args.batch = 2, 64, 4, 32, 4
    if args.min_compress_bytes is None:
        # --tiny's TP messages (batch x seq x d_model floats, 32 KiB) are below coccl's
        # default threshold: lower it, so that the smoke run compresses what it shows
        default = coccl.torch.DEFAULT_MIN_COMPRESS_BYTES
        args.min_compress_bytes = TINY_MIN_COMPRESS_BYTES if args.tiny else default
    if args.warmup >= args.steps:
        args.warmup = 0
    return args


# ------------------------------------------------------------------- model
def interleave_qkv(model: GPT, tp: int) -> None:
    """Reorder every fused ``[q | k | v]`` projection's rows to ``[q_0 k_0 v_0 | q_1 k_1
    v_1 | ...]`` (``_r``: the heads of TP rank ``r``), so that ColwiseParallel's
    contiguous row shards give each rank whole heads of q, k and v, which is what the
    attention's ``chunk(3)`` expects (Megatron stores QKV this way)."""
    d = model.cfg.d_model
    for block in model.blocks:
        qkv = block.attn.qkv
        with torch.no_grad():
            qkv.weight.copy_(qkv.weight.view(3, tp, d // tp, d).transpose(0, 1).reshape(3 * d, d))
            qkv.bias.copy_(qkv.bias.view(3, tp, d // tp).transpose(0, 1).reshape(3 * d))


def parallelize(model: GPT, mesh: Any) -> GPT:
    """The TP plan: per block, QKV and fc1 column-parallel, proj and fc2 row-parallel;
    embeddings, layer norms and the LM head replicated (plain tensors)."""
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if model.cfg.heads % mesh.size():
        raise ValueError(f"heads={model.cfg.heads} is not divisible by the TP size {mesh.size()}")
    interleave_qkv(model, mesh.size())
    plan = {}
    for i in range(model.cfg.layers):
        plan[f"blocks.{i}.attn.qkv"] = ColwiseParallel()
        plan[f"blocks.{i}.attn.proj"] = RowwiseParallel()
        plan[f"blocks.{i}.mlp.fc1"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.fc2"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def replicated_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter that is not a DTensor (those all ranks replicate)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            h.update(name.encode())
            h.update(bytes(p.detach().cpu().contiguous().view(torch.uint8).numpy()))
    return h.hexdigest()


# ---------------------------------------------------------------- training
def make_group(spec: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """A TP group of every rank: ``plain`` (Gloo / NCCL), or coccl with codec ``spec``,
    which may end in ``@algorithm`` (``identity@native``; default ``--algorithm``)."""
    if spec == "plain":
        backend = "nccl" if args.device == "cuda" else "gloo"
        return dist.new_group(backend=backend), {"group": "plain", "backend": backend}
    codec, _, algorithm = spec.partition("@")
    algorithm = algorithm or args.algorithm
    opts = coccl.torch.CocclOptions(
        compressor=parse_compressor(codec),
        algorithm=algorithm,
        min_compress_bytes=args.min_compress_bytes,
    )
    record = {"group": "coccl", "compressor": opts.codec.get_config(), "algorithm": algorithm}
    return dist.new_group(backend="coccl", pg_options=opts), record


def train(spec: str, index: int, args: argparse.Namespace, device: torch.device) -> dict:
    """Train the model from ``--seed`` on one TP group; every rank returns the record."""
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    group, record = make_group(spec, args)
    # a mesh name per run: DTensor caches decisions by mesh, and meshes of the same ranks
    # compare equal unless their names differ (the run would reuse an earlier group)
    mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=(f"tp{index}",))
    cfg = GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    torch.manual_seed(args.seed)
    model = parallelize(GPT(cfg).to(device), mesh)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), foreach=False,
    )  # fmt: skip
    batches = train_batches(split(load_text())[0], args.batch, cfg.seq, args.seed, device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.dtype == "bfloat16"
        else nullcontext()
    )
    losses: list[float] = []
    step_s: list[float] = []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        x, y = next(batches)
        start = time.perf_counter()
        with autocast:
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronizes the device: the step is done
        step_s.append(time.perf_counter() - start)
    timed = step_s[args.warmup :]
    digests: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(digests, replicated_digest(model))
    record.update(
        losses=losses,
        final_loss=losses[-1],
        step_time_s=statistics.median(timed),
        tokens_per_s=args.batch * cfg.seq * len(timed) / sum(timed),
        replicated_identical=len(set(digests)) == 1,
    )
    if record["group"] == "coccl":
        record["calls"] = group.stats()
    dist.destroy_process_group(group)
    return record


def uncompressed_lossy(record: dict[str, Any]) -> bool:
    """Whether a coccl group of a lossy codec ran every call exact (all under
    min_compress_bytes): the run then showed nothing of its codec."""
    if record["group"] != "coccl" or coccl.get_compressor(record["compressor"]).lossless:
        return False
    return not any(key.endswith(":compressed") for key in record.get("calls", {}))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_here = not dist.is_initialized()
    if started_here:
        # torchrun's or mpiexec's environment (this also sets LOCAL_RANK under mpiexec);
        # the default group stays plain, each run makes its own TP group
        coccl.torch.init_process_group(backend=None)
    rank, tp = dist.get_rank(), dist.get_world_size()
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", tp))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_ranks))
    device = torch.device("cpu")
    if args.device == "cuda":
        # the same kernels on every rank and every step: replicas must stay bitwise equal
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if rank == 0 else (lambda *a: None)

    runs = []
    for index, spec in enumerate(s.strip() for s in args.groups.split(",")):
        record = train(spec, index, args, device)
        log(
            f"[tp_dtensor] {spec:>12}: loss {record['losses'][0]:.4f} -> {record['final_loss']:.4f}"
            f"  step {1e3 * record['step_time_s']:.2f} ms  {record['tokens_per_s']:.0f} tok/s"
            f"  {record.get('calls', '')}"
        )
        runs.append({"spec": spec, **record})
        if uncompressed_lossy(record):
            log(
                f"[tp_dtensor] {spec}: no call was compressed: every TP message was below "
                f"--min-compress-bytes {args.min_compress_bytes} (lower it to compress)"
            )
    cfg = GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    commit, dirty = git_commit()
    result = {
        "command": shlex.join(
            ["python", "examples/tp_dtensor.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "commit_dirty": dirty,
        "step_time_note": "step_time_s: the median timed step; tokens_per_s: the timed "
        "tokens over the sum of the timed steps (their mean)",
        "tp": tp,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if args.device == "cuda" else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "model": {
            "layers": cfg.layers,
            "d_model": cfg.d_model,
            "heads": cfg.heads,
            "seq": cfg.seq,
            "params": sum(p.numel() for p in GPT(cfg).parameters()),
        },  # fmt: skip
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "algorithm": args.algorithm,
        "min_compress_bytes": args.min_compress_bytes,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("COCCL_", "NCCL_"))},
        "runs": runs,
    }
    identical = all(r["replicated_identical"] for r in runs)
    if rank == 0:
        report(result, args.out, identical, "tp_dtensor")
    if started_here:
        dist.destroy_process_group()
    return 0 if identical else 3


if __name__ == "__main__":
    exit_now(main())
