"""3D-parallel training (TP x DP x PP) with PyTorch's own APIs over coccl groups.

The repo's byte-level GPT (examples/tp_gpt.py) on a ``(pp, dp, tp)`` DeviceMesh built by a
``coccl.torch.policy`` (``--policy``: ``none``, ``identity``, ``taco3d``, ``taco3d_pp6``,
``taco3d_pp4h``, ``tp_mx6_nv4`` or a .json / .toml file), in torchtitan's order: the model
is cut into ``--pp`` stages by hand (stage s holds its share of the blocks; the first the
embeddings, the last the final norm and LM head), each stage is tensor-parallelized by
``parallelize_module`` (QKV and fc1 ``ColwiseParallel``, proj and fc2 ``RowwiseParallel``
over ``mesh["tp"]``), then sharded by FSDP2's ``fully_shard`` over ``mesh["dp"]`` (each
layer norm and block, then the stage; the row-parallel biases stay out: see
``build_stage``), and run by ``torch.distributed.pipelining`` (``PipelineStage`` over
``mesh["pp"]``, ``ScheduleGPipe`` or ``Schedule1F1B``).

DP: FSDP2 gathers the parameters and reduce-scatters the gradients of flat buffers it
packs itself every step, through the comm objects ``set_custom_all_gather`` /
``set_custom_reduce_scatter`` give it: ``coccl.torch.shard_comms`` gives every FSDP
unit a pair with the policy's DP traffic (codec, schedule, threshold), each keeping its
own state over that unit's one flat layout: the ``delta`` gather a replica of the
gathered parameters, to which every rank adds the gathered 4-bit differences (SDP4Bit's
weight differences; the first gather exact), a ``feedback`` reduce its residual. The
master shards FSDP2 keeps stay exact; forward and backward use the replica. State on TP
cannot be carried (DTensor's collectives take none): it runs exact and the JSON's
``state_dropped`` says so.

    # 8 CPU ranks, 2 x 2 x 2, a seconds-long model
    python -m torch.distributed.run --standalone --nproc-per-node 8 examples/train_3d.py \\
        --tp 2 --pp 2 --dp 2 --policy taco3d --tiny --steps 4 --out t3d.json
    # 8 GPUs of one node
    torchrun --nproc-per-node 8 examples/train_3d.py --tp 2 --pp 2 --dp 2 --device cuda \\
        --policy taco3d --out t3d.json

Rank 0 writes one JSON (``--out``): the loss of every step (the mean over the DP
replicas' microbatches), tokens/s, and per mesh dimension the calls of every group by
``collective:path`` and the bytes coccl's schedules sent for them (``sent``; a call that
coccl hands to the transport's own collective, an exact one, counts its input bytes under
``input`` only; PP's sends under ``send:path``, their payload bytes), summed over the
ranks. With ``--policy identity`` the losses equal
``--policy none``'s to float rounding (the order of the sums differs).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_dtensor import interleave_qkv  # noqa: E402
from tp_gpt import GPT, GPTConfig, exit_now, load_text, lr_at, split, train_batches  # noqa: E402

import coccl.torch  # noqa: E402
from coccl.core.arrays import as_flat  # noqa: E402
from coccl.torch.policy import DIMS, NAMED, Policy, load_policy  # noqa: E402

TINY_MIN_COMPRESS_BYTES = 1024  # --tiny: its messages are a few KiB


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--policy", default="taco3d", help=f"{', '.join(NAMED)} or a .json/.toml")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    p.add_argument("--microbatches", type=int, default=0, help="0: --pp")
    p.add_argument("--min-compress-bytes", type=int, default=None,
                   help="one threshold for every entry (default: the policy's; --tiny: "
                   f"{TINY_MIN_COMPRESS_BYTES})")  # fmt: skip
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per DP replica and step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke configuration")
    p.add_argument("--out", type=Path, help="rank 0 writes the result JSON here")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.d_model, args.heads, args.seq, args.batch = 2, 64, 4, 16, 4
        if args.min_compress_bytes is None:
            args.min_compress_bytes = TINY_MIN_COMPRESS_BYTES
    args.microbatches = args.microbatches or args.pp
    if args.warmup >= args.steps:
        args.warmup = 0
    if args.layers % args.pp:
        p.error(f"--layers {args.layers} is not divisible by --pp {args.pp}")
    if args.batch % args.microbatches:
        p.error(f"--batch {args.batch} is not divisible by {args.microbatches} microbatches")
    return args


# --------------------------------------------------------------- the policy
def make_policy(args: argparse.Namespace) -> tuple[Policy, list[str]]:
    """The policy filled for this model, without the state this script cannot carry
    (all but DP's: DTensor's TP collectives take no state)."""
    policy = load_policy(args.policy).fill(d_model=args.d_model)
    if args.min_compress_bytes is not None:
        policy = policy.with_threshold(args.min_compress_bytes)
    return policy.without_state(carried=("dp.gather", "dp.reduce"))


# --------------------------------------------------------------- the model
class Stage(nn.Module):
    """Pipeline stage ``index`` of ``count`` of a GPT: its blocks, the embeddings on the
    first stage, the final norm and head on the last (torchtitan's manual split)."""

    def __init__(self, model: GPT, index: int, count: int) -> None:
        super().__init__()
        per = model.cfg.layers // count
        self.first, self.last = index == 0, index == count - 1
        self.tok = model.tok if self.first else None
        self.pos = model.pos if self.first else None
        self.blocks = nn.ModuleList(model.blocks[index * per : (index + 1) * per])
        self.ln_f = model.ln_f if self.last else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


def build_stage(args: argparse.Namespace, mesh: Any, policy: Policy, device: torch.device):
    """This rank's stage: TP over mesh["tp"], then FSDP2 over mesh["dp"]."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    cfg = GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    torch.manual_seed(args.seed)
    full = GPT(cfg)  # the same weights on every rank, then cut
    tp = mesh["tp"].size()
    if cfg.heads % tp:
        raise ValueError(f"heads={cfg.heads} is not divisible by --tp {tp}")
    interleave_qkv(full, tp)
    stage = Stage(copy.deepcopy(full), mesh["pp"].get_local_rank(), mesh["pp"].size())
    plan: dict[str, Any] = {}
    for i in range(len(stage.blocks)):
        styles = {"attn.qkv": ColwiseParallel, "attn.proj": RowwiseParallel,
                  "mlp.fc1": ColwiseParallel, "mlp.fc2": RowwiseParallel}  # fmt: skip
        plan |= {f"blocks.{i}.{name}": style() for name, style in styles.items()}
    stage = parallelize_module(stage.to(device), mesh["tp"], plan)
    # A lossy DP codec's groups run over FSDP2's flat buffers: a group that held both a
    # TP-sharded and a TP-replicated parameter would quantize the replicated one with
    # other scales on each TP rank, and the TP replicas would drift apart. So the
    # replicated parameters get FSDP units of their own (the layer norms; the stage's
    # root holds the embeddings, final norm and head), and the row-parallel biases,
    # which share their module with a sharded weight, stay out of FSDP: replicated over
    # DP, their gradients averaged exactly (``average_biases``).
    # (in the parameters' order: every DP rank must reduce the same one at a time)
    biases = [p for p in stage.parameters() if isinstance(p, DTensor) and tp_replicated(p)]
    units = [m for b in stage.blocks for m in (b.ln1, b.ln2, b)] + [stage]
    for module in units:
        fully_shard(module, mesh=mesh["dp"], ignored_params=set(biases))
        if policy.backend == "coccl":  # one pair per unit: its states see one layout
            coccl.torch.shard_comms(module, policy.traffic["dp"]["gather"],
                                    policy.traffic["dp"]["reduce"])  # fmt: skip
    return stage, biases


def tp_replicated(p: torch.Tensor) -> bool:
    """Whether TP replicates ``p``: a plain tensor, or a DTensor Replicate on "tp"."""
    if not isinstance(p, DTensor):
        return True
    names = p.device_mesh.mesh_dim_names or ()
    return "tp" not in names or isinstance(p.placements[names.index("tp")], Replicate)


def average_biases(biases: list[torch.Tensor], group: Any) -> None:
    """The DP average of the gradients of parameters FSDP2 does not hold, exact (a
    DTensor gradient may be pending a TP reduction: made Replicate first)."""
    with coccl.torch.options(group, compressor="identity", algorithm="auto"):
        for p in biases:
            if p.grad is None:
                continue
            replicate = [Replicate()] * p.device_mesh.ndim
            g = p.grad.redistribute(p.device_mesh, replicate).to_local().contiguous()
            dist.all_reduce(g, group=group)
            p.grad = DTensor.from_local(g.div_(group.size()), p.device_mesh, replicate)


# ---------------------------------------------------------------- training
def group_traffic(group: Any) -> dict[str, Any]:
    """A group's calls by ``collective:path`` and the bytes of its coccl collectives."""
    if not isinstance(group, coccl.torch.CocclProcessGroup):
        return {"backend": dist.get_backend(group)}
    calls = coccl.torch.stats(group)
    return {
        "backend": "coccl",
        "calls": {k: v for k, v in calls.items() if not k.startswith("comm:")},
        "bytes": dict(getattr(group, "coccl_traffic", {})),
        "comm_bytes_sent": calls.get("comm:bytes_sent", 0),
    }


class CountingComm:
    """Counts a coccl group's traffic by ``collective:path``: each collective's input
    bytes and the bytes coccl's schedules sent for it, and each point-to-point send's
    input bytes and payload bytes (the backend counts calls only).

    The counting wrappers are installed on the Communicator itself, not around it: the
    torch backend runs a CPU tensor's collective through ``iallreduce`` /
    ``ireduce_scatter`` / ``iallgather``, whose worker calls the Communicator's own
    ``allreduce`` / ``reduce_scatter`` / ``allgather`` (one at a time, so the
    ``bytes_sent`` difference around a call is that call's), and point-to-point through
    ``isend``. A delta gather's first call (its state not bound yet) is exact."""

    COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.traffic: Counter[str] = Counter()
        for name in self.COLLECTIVES:
            setattr(comm, name, types.MethodType(self._measured(name), comm))
        comm.isend = types.MethodType(self._send(), comm)

    @staticmethod
    def _path(kwargs: dict[str, Any]) -> str:
        codec = kwargs.get("compressor", "identity")
        lossy = not all(c.lossless for c in _codecs(codec))
        delta = kwargs.get("delta")
        if delta is not None and not delta.bound:
            lossy = False  # the first delta gather sends the weights exactly
        return "compressed" if lossy else "exact"

    def _measured(self, collective: str) -> Any:
        inner = getattr(type(self.comm), collective)
        traffic = self.traffic

        def call(comm: Any, x: Any, out: Any = None, **kwargs: Any) -> Any:
            key = f"{collective}:{CountingComm._path(kwargs)}"
            before = comm.stats()["bytes_sent"]
            result = inner(comm, x, out, **kwargs)
            traffic[f"{key}:sent"] += comm.stats()["bytes_sent"] - before
            traffic[f"{key}:input"] += _nbytes(x)
            return result

        call.__name__ = collective
        return call

    def _send(self) -> Any:
        inner = type(self.comm).isend
        traffic = self.traffic

        def isend(comm: Any, x: Any, dst: Any, **kwargs: Any) -> Any:
            codec = coccl.get_compressor(kwargs.get("compressor") or "identity")
            key = f"send:{'exact' if codec.lossless else 'compressed'}"
            traffic[f"{key}:input"] += _nbytes(x)
            traffic[f"{key}:sent"] += (
                _nbytes(x) if codec.lossless else codec.encoded_nbytes(x.numel(), _np_dtype(x))
            )
            return inner(comm, x, dst, **kwargs)

        isend.__name__ = "isend"
        return isend


def _codecs(codec: Any) -> list[Any]:
    pair = isinstance(codec, (list, tuple))
    return [coccl.get_compressor(c) for c in (codec if pair else [codec])]


def _nbytes(x: Any) -> int:
    if isinstance(x, (list, tuple)):  # a bucket
        return sum(_nbytes(t) for t in x)
    return int(x.numel() * x.element_size()) if isinstance(x, torch.Tensor) else int(x.nbytes)


def _np_dtype(x: Any) -> Any:
    return as_flat(x).dtype  # coccl's numpy dtype of a tensor (bfloat16 too)


def train(args: argparse.Namespace, mesh: Any, policy: Policy, device: torch.device) -> dict:
    """Train ``--steps`` steps; every rank returns its loss history and timings."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: PLC0415

    for dim in DIMS:
        group = mesh[dim].get_group()
        if isinstance(group, coccl.torch.CocclProcessGroup):
            group.coccl_traffic = CountingComm(group.comm).traffic
    stage_module, biases = build_stage(args, mesh, policy, device)
    pp_rank, pp = mesh["pp"].get_local_rank(), mesh["pp"].size()
    stage = PipelineStage(stage_module, pp_rank, pp, device, group=mesh["pp"].get_group())

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    params = list(stage_module.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    # every DP replica its own data; the TP and PP ranks of one replica the same
    dp_rank = mesh["dp"].get_local_rank()
    batches = train_batches(
        split(load_text())[0], args.batch, args.seq, args.seed + dp_rank, device
    )
    losses: list[float] = []
    step_s: list[float] = []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        # pipelining checks a stage's input strides against the declared ones: the
        # batch's token slices of one (batch, seq + 1) buffer are strided
        x, y = (t.contiguous() for t in next(batches))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        micro: list[torch.Tensor] = []
        if stage.is_first:
            schedule.step(x, target=y if stage.is_last else None, losses=micro)
        elif stage.is_last:
            schedule.step(target=y, losses=micro)
        else:
            schedule.step()
        average_biases(biases, mesh["dp"].get_group())
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_s.append(time.perf_counter() - start)
        if stage.is_last:
            losses.append(float(torch.stack([m.detach().float() for m in micro]).mean()))
    traffic = {dim: group_traffic(mesh[dim].get_group()) for dim in DIMS}
    return {
        "losses": losses, "step_s": step_s, "last": stage.is_last, "traffic": traffic,
        "coordinate": mesh.get_coordinate(), "digest": tp_replicated_digest(stage_module),
    }  # fmt: skip


def tp_replicated_digest(module: nn.Module) -> str:
    """SHA-256 of this rank's shards of the parameters TP replicates (layer norms,
    embeddings, head, biases of row-parallel layers): the TP ranks of one (pp, dp)
    coordinate must hold the same bytes, also when the TP sums are compressed."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        if tp_replicated(p):
            h.update(name.encode())
            h.update(bytes(p.to_local().detach().cpu().contiguous().view(torch.uint8).numpy()))
    return h.hexdigest()


def tp_replicas_identical(records: list[dict[str, Any]]) -> bool:
    """Whether every (pp, dp) coordinate's TP ranks hold the same replicated parameters."""
    digests: dict[tuple[int, int], set[str]] = {}
    for r in records:
        pp_rank, dp_rank, _ = r["coordinate"]
        digests.setdefault((pp_rank, dp_rank), set()).add(r["digest"])
    return all(len(d) == 1 for d in digests.values())


def summed(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per dimension, the ranks' counters summed."""
    out: dict[str, Any] = {}
    for dim in DIMS:
        rows = [r["traffic"][dim] for r in records]
        entry: dict[str, Any] = {"backend": rows[0]["backend"]}
        if entry["backend"] == "coccl":
            for key in ("calls", "bytes"):
                total: Counter[str] = Counter()
                for row in rows:
                    total.update(row[key])
                entry[key] = dict(sorted(total.items()))
            entry["comm_bytes_sent"] = sum(row["comm_bytes_sent"] for row in rows)
        out[dim] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policy, dropped = make_policy(args)
    coccl.torch.init_process_group(
        backend="cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != args.tp * args.pp * args.dp:
        raise SystemExit(f"{world} ranks, but --tp x --pp x --dp is {args.tp * args.pp * args.dp}")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    if rank == 0:
        for line in dropped:
            print(f"[train_3d] fully_shard keeps no per-buffer state: {line}", flush=True)
        for kind, carried in policy.pp_codecs_carried().items():
            codec = policy.traffic["pp"][kind].codec
            if not carried and codec["id"] != "identity":
                print(f"[train_3d] pp.{kind}: this coccl's CocclOptions has no p2p field; "
                      f"{codec['id']} is not applied, PP sends run exact", flush=True)  # fmt: skip
    mesh = policy.device_mesh(device.type, (args.pp, args.dp, args.tp))
    record = train(args, mesh, policy, device)
    records: list[Any] = [None] * world
    dist.all_gather_object(records, record)
    identical = tp_replicas_identical(records)
    if rank == 0:
        write_result(args, policy, dropped, records, device)
    dist.destroy_process_group()
    return 0 if identical else 3


def write_result(args: argparse.Namespace, policy: Policy, dropped: list[str],
                 records: list[dict[str, Any]], device: torch.device) -> None:  # fmt: skip
    """Rank 0's JSON: losses averaged over the last stage's ranks (DP replicas; TP ranks
    agree), tokens/s of the slowest rank, the traffic per dimension."""
    last = [r["losses"] for r in records if r["last"]]
    losses = [sum(step) / len(step) for step in zip(*last, strict=True)]
    timed = [sum(r["step_s"][args.warmup :]) for r in records]
    steps = args.steps - args.warmup
    tokens = args.batch * args.seq * args.dp * steps
    cfg = GPTConfig(args.layers, args.d_model, args.heads, args.seq)
    result = {
        "mesh": {"pp": args.pp, "dp": args.dp, "tp": args.tp},
        "policy": policy.to_dict(),
        "state_dropped": dropped,
        "pp_codecs_carried": policy.pp_codecs_carried(),
        "schedule": args.schedule,
        "microbatches": args.microbatches,
        "device": device.type,
        "torch": torch.__version__,
        "model": {
            "layers": cfg.layers,
            "d_model": cfg.d_model,
            "heads": cfg.heads,
            "seq": cfg.seq,
            "params": sum(p.numel() for p in GPT(cfg).parameters()),
        },
        "batch_per_replica": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "tokens_per_s": tokens / max(timed) if steps else None,
        "traffic": summed(records),
        "tp_replicas_identical": tp_replicas_identical(records),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: result[k] for k in ("final_loss", "tokens_per_s")}), flush=True)


if __name__ == "__main__":
    exit_now(main())
