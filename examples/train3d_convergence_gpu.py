"""The 3D accuracy table: a GPT trained at TP = 4 x PP = 2 x DP = 2 on one GPU, per recipe.

Every run trains the byte-level GPT of ``tp_convergence_gpu.py`` (the recorded setup: 4
layers, d = 768, 8 heads, context 256, 28.9 M parameters, 2000 steps of 8 x 256 bytes,
AdamW at peak lr 6e-4, bfloat16 autocast; its corpus, seeds, data order, workers, MPS,
CUDA graphs, checkpoints, statistics and plot are imported from it) with all three
dimensions simulated in one process:

* TP = 4: ``coccl.tensor_parallel.VirtualTPGroup`` (two_shot), bitwise a real TP group.
* PP = 2: layers 0-1 and 2-3; between them ``coccl.torch.virtual_3d.PPBoundary``, the codec's
  roundtrip of the activation forward and of its gradient backward (one payload each).
* DP = 2: two replicas of the weights, each half the batch (4 x 256). Their float32
  gradients go through ``coccl.torch.virtual_3d.VirtualDPGroup.reduce_scatter`` (the two-shot
  compressed ReduceScatter's arithmetic, ``avg``), AdamW updates the float32 master
  weights of each shard (elementwise: the optimizer on the concatenated shards is each
  owner's update of its own), and ``allgather_delta`` brings the replicas' weights to the
  masters (the delta rule; an exact plain AllGather where the arm's codec is exact).
  Per pipeline stage the gradients are two DP buffers, as a real run's buckets: one row
  per TP rank of its shards (every TP rank's DP group, all four at once), and one of the
  parameters every TP rank holds alike (kept apart so that their codec groups never mix
  with shards and TP replicas stay bitwise equal). Buffers are zero-padded to a multiple
  of DP x the codecs' group sizes.

Recipes (the issue's; ``RECIPES`` holds the configs, the JSON records them):

    TP    every TP AllReduce, forward and backward: taco, two_shot
    PP    forward activations: tah (TAH-Quant: 4 bits, the lowest-entropy 20% of tokens
          at 3), row = d_model; backward gradients: int 6 bits, groups of 32
    DP    gradients: SDP4Bit's intra-node recipe, int 8 bits, groups of 128 (one node of
          DP = 2; ``--dp-reduce inter`` takes its inter-node one, int 4 bits after a
          32-point Hadamard); parameters: 4-bit weight differences in groups of 2048
          (int 4 bits, groups of 2048) with the delta rule, the first step exact

Arms (``uncompressed`` is the same 3D run with every codec exact, so the deltas are the
codecs' alone): uncompressed, tp_taco, dp_recipe, pp_recipe, taco3d (all three),
tp_tah (TAH-Quant's codec on the TP traffic), tp_int4_h32 (int 4 bits, Hadamard 32, on
TP), taco3d_pp6 (taco3d with the PP forward at 6 bits: int 6 bits in groups of 32, the
backward's codec, in place of tah), taco3d_pp4h (the PP forward as int 4 bits in groups of
32 after a 32-point Hadamard: tah's bytes, 0.625 an element against 0.62). Target: taco3d
within +0.5% of uncompressed with the interval's upper end below +1%.

    # the table on one H200 (40 runs; see --help for the sizing options)
    python examples/train3d_convergence_gpu.py run
    # a seconds-long CPU smoke run (tiny model; --stand-ins: int8 for int and tah where
    # those codecs are not installed)
    python examples/train3d_convergence_gpu.py run --tiny --steps 3 --arms uncompressed,taco3d

The work, counted (torch operators of one step, on the CPU: the dispatch count stands in
for the GPU's kernels): a recorded TP = 4 step is about 2100 operators, a 3D step about
4700 (two replicas of half the batch, each a TP = 4 forward and backward with every
rank's linears and the simulated AllReduces; then four DP buffers reduced, AdamW and the
AllGather): about 2.2 times the work, at the same matmul FLOPs. The recorded TP = 4 runs
made about 32 steps/s each at 8 runs per H200 under MPS; the recorded 3D runs made about
19 steps/s each at 7 per H200 (105-120 s for 2000 steps), so the 40 runs of all eight
arms take five waves of 8 (about 10 minutes plus a minute of start-up). The workers take
the runs round robin, seed after seed, every arm of a seed together (``jobs_in_order``):
with as many workers as arms, or a multiple, every wave completes whole seeds, so a
cut-off table still pairs its runs.

Each run's JSON lands in ``--work-dir`` as it finishes, and the report (``--out``, with
the runs so far and ``incomplete``) is rewritten every 30 s and at the end; at
``--time-limit-s`` the workers stop at a checkpoint, and the same command resumes.

Payload-scoped codecs (tah's lowest-entropy share of each payload's tokens, NVFP4's
per-payload scale) depend on where payloads are cut: ``VirtualTPGroup`` simulates one
payload per (rank, shard), a real group whose each shard is one chunk (its docstring
says which real calls cut so). Runs recorded before that fix encoded every rank's shards
of a step in one payload (one token choice, one NVFP4 scale across the group's shards):
not bitwise a real run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import convergence_stats as stats  # noqa: E402
import tp_convergence_gpu as tpc  # noqa: E402

SCRIPT = Path(__file__).resolve()
DEFAULT_OUT = ROOT / "bench" / "results" / "tp3d-convergence-gpu.json"
TP, PP, DP = 4, 2, 2
TARGET_ARM = "taco3d"


def recipes(d_model: int) -> dict[str, dict[str, Any]]:
    """The codec configs of the recipes (``row``: the model's width)."""
    return {
        "tp_taco": {"id": "taco"},
        "tp_tah": {"id": "tah", "row": d_model},
        "tp_int4_h32": {"id": "int", "bits": 4, "group_size": 128, "hadamard": 32},
        "pp_fwd": {"id": "tah", "row": d_model},
        "pp_bwd": {"id": "int", "bits": 6, "group_size": 32},
        "pp_fwd_6bit": {"id": "int", "bits": 6, "group_size": 32},
        "pp_fwd_4bit_h32": {"id": "int", "bits": 4, "group_size": 32, "hadamard": 32},
        "dp_reduce_intra": {"id": "int", "bits": 8, "group_size": 128},
        "dp_reduce_inter": {"id": "int", "bits": 4, "group_size": 128, "hadamard": 32},
        "dp_gather": {"id": "int", "bits": 4, "group_size": 2048},
    }


@dataclass(frozen=True)
class Arm3D:
    """The codec of each kind of traffic; None: exact."""

    name: str
    tp: dict[str, Any] | None = None
    pp_fwd: dict[str, Any] | None = None
    pp_bwd: dict[str, Any] | None = None
    dp_reduce: dict[str, Any] | None = None
    dp_gather: dict[str, Any] | None = None


ARM_NAMES = ["uncompressed", "tp_taco", "dp_recipe", "pp_recipe", "taco3d", "tp_tah"]
ARM_NAMES += ["tp_int4_h32", "taco3d_pp6", "taco3d_pp4h"]


def make_arm(name: str, d_model: int, dp_reduce: str = "intra", stand_ins: bool = False) -> Arm3D:
    """Arm ``name`` for a model of width ``d_model``; ``stand_ins`` replaces the int and
    tah codecs by int8 (a CPU smoke run where those codecs are missing)."""
    r = recipes(d_model)
    tp = {"tp_taco": r["tp_taco"], "taco3d": r["tp_taco"], "tp_tah": r["tp_tah"]}
    tp["tp_int4_h32"], tp["taco3d_pp6"] = r["tp_int4_h32"], r["tp_taco"]
    tp["taco3d_pp4h"] = r["tp_taco"]
    pp = name in ("pp_recipe", "taco3d", "taco3d_pp6", "taco3d_pp4h")
    dp = name in ("dp_recipe", "taco3d", "taco3d_pp6", "taco3d_pp4h")
    fwd = {"taco3d_pp6": r["pp_fwd_6bit"], "taco3d_pp4h": r["pp_fwd_4bit_h32"]}
    arm = Arm3D(
        name,
        tp=tp.get(name),
        pp_fwd=fwd.get(name, r["pp_fwd"]) if pp else None,
        pp_bwd=r["pp_bwd"] if pp else None,
        dp_reduce=r[f"dp_reduce_{dp_reduce}"] if dp else None,
        dp_gather=r["dp_gather"] if dp else None,
    )
    if name not in ARM_NAMES:
        raise ValueError(f"unknown arm {name!r}; known: {', '.join(ARM_NAMES)}")
    if not stand_ins:
        return arm
    swap = {f.name: _stand_in(getattr(arm, f.name)) for f in dataclasses.fields(arm)[1:]}
    return dataclasses.replace(arm, **swap)


def _stand_in(config: dict[str, Any] | None) -> dict[str, Any] | None:
    return {"id": "int8"} if config is not None and config["id"] in ("int", "tah") else config


# ---------------------------------------------------------------------- the 3D model
def build_3d(
    model: Any, arm: Arm3D, device: Any, lr: Any, x: Any, y: Any, autocast: Any
) -> tuple[Any, Any, Any]:
    """The full ``model`` as TP x PP x DP virtual ranks, its sharded optimizer and the
    training step (``tp_convergence_gpu.train``'s ``build``)."""
    import torch.nn.functional as F  # noqa: N812, PLC0415
    import tp_gpt  # noqa: PLC0415
    from dp_buffers import ShardedAdamW, stage_buffers  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    from coccl.tensor_parallel import VirtualTPGroup  # noqa: PLC0415
    from coccl.torch.virtual_3d import PPBoundary, VirtualDPGroup  # noqa: PLC0415

    model = tp_gpt.parallelize(model, VirtualTPGroup(TP, "two_shot", arm.tp or "identity"))
    half = len(model.blocks) // PP
    model.blocks[half] = nn.Sequential(PPBoundary(arm.pp_fwd, arm.pp_bwd), model.blocks[half])
    model.to(device)
    dp = VirtualDPGroup(
        DP,
        arm.dp_reduce or "identity",
        arm.dp_gather or "identity",
        delta=arm.dp_gather is not None,
    )
    buffers = stage_buffers(model, half, DP, dp)
    opt = ShardedAdamW(buffers, dp, lr, tp_gpt.make_optimizer)
    params = [p for b in buffers for row in b.rows for p in row]
    hb = x.shape[0] // DP

    def step_fn() -> Any:
        losses, grads = [], []
        for r in range(DP):  # each replica: its half of the batch, its own gradients
            xs, ys = x[r * hb : (r + 1) * hb], y[r * hb : (r + 1) * hb]
            with autocast():
                loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten())
            got = dict(zip(params, _grads(loss, params), strict=True))
            grads.append([b.flatten(got) for b in buffers])
            losses.append(loss.detach())
        opt.step(grads)
        return sum(losses) / DP

    return model, opt, step_fn


def _grads(loss: Any, params: list[Any]) -> tuple[Any, ...]:
    import torch  # noqa: PLC0415

    return torch.autograd.grad(loss, params)


def arm_fields(arm: Arm3D, dp_reduce: str, stand_ins: bool) -> dict[str, Any]:
    return {
        "algorithm": "two_shot",
        "compressor": {k: v for k, v in asdict(arm).items() if k != "name"},
        "layout": {"tp": TP, "pp": PP, "dp": DP},
        "dp_reduce_recipe": dp_reduce,
        "stand_ins": stand_ins,
    }


def done(work: Path, job: Any, setup: Any, args: argparse.Namespace) -> bool:
    """Whether ``work`` holds ``job``'s finished run of this setup, arm recipe and
    stand-in choice (``tp_convergence_gpu.finished``)."""
    arm = make_arm(job.arm, setup.d_model, args.dp_reduce, args.stand_ins)
    fields = arm_fields(arm, args.dp_reduce, args.stand_ins)
    return tpc.finished(work / f"{job.name}.json", setup, fields)


# ---------------------------------------------------------------------------- worker
def worker_main(args: argparse.Namespace) -> int:
    """Run ``args.jobs`` one after another in this process."""
    setup = tpc.Setup(**json.loads(args.setup))
    device = tpc.configure_torch(setup)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    work: Path = args.work_dir
    for name in args.jobs.split(","):
        arm_name, _, seed = name.rpartition("-seed")
        job = tpc.Job(arm_name.removesuffix(f"-tp{TP}"), TP, int(seed))
        out = work / f"{job.name}.json"
        if done(work, job, setup, args):
            continue
        arm = make_arm(job.arm, setup.d_model, args.dp_reduce, args.stand_ins)
        result = tpc.train(
            job,
            setup,
            arm,
            device,
            work / f"{job.name}.ckpt",
            lambda: stopping["now"],
            lambda msg: print(msg, flush=True),
            build=build_3d,
            arm_fields=arm_fields(arm, args.dp_reduce, args.stand_ins),
        )
        if result is None:
            return tpc.INTERRUPTED
        tpc.write_json(out, result)
        (work / f"{job.name}.ckpt").unlink(missing_ok=True)
    return 0


# ---------------------------------------------------------------------------- runner
def jobs_in_order(arms: list[str], seeds: list[int]) -> list[Any]:
    """Seed after seed, every arm of a seed together: the workers' first runs (round
    robin) complete whole seeds first, so a cut-off table still pairs its runs."""
    return [tpc.Job(arm, TP, seed) for seed in seeds for arm in arms]


def run_main(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(msg, flush=True)

    began = time.perf_counter()
    base = tpc.SMOKE if args.tiny else tpc.FULL
    device = "cpu" if args.tiny else args.device
    setup = dataclasses.replace(
        base, steps=args.steps or base.steps, device=device,
        cuda_graph="off" if device == "cpu" else args.cuda_graph,
    )  # fmt: skip
    arms, seeds = args.arms.split(","), [int(s) for s in args.seeds.split(",")]
    for a in arms:
        make_arm(a, setup.d_model)  # an unknown arm fails here, before any worker
    jobs = jobs_in_order(arms, seeds)
    devices = ["cpu"] if device == "cpu" else (args.gpus.split(",") if args.gpus else [])
    devices = devices or tpc.visible_gpus()
    if not devices:
        raise SystemExit("no GPU found (nvidia-smi -L); use --tiny for a CPU run")
    per_device = args.jobs_per_gpu or -(-len(jobs) // len(devices))
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    todo = [j for j in jobs if not done(work, j, setup, args)]
    log(f"[run] {len(jobs)} runs ({len(jobs) - len(todo)} already in {work}), "
        f"{len(devices)} device(s) x {per_device} workers; setup {asdict(setup)}")  # fmt: skip
    extra = ("--dp-reduce", args.dp_reduce) + (("--stand-ins",) if args.stand_ins else ())
    workers: list[Any] = []
    complete = True
    with tpc.mps_daemon("off" if device == "cpu" else args.mps, log) as mps:

        def write(final: bool = False) -> dict[str, Any]:
            report = collect(jobs, setup, arms, seeds, mps, args, time.perf_counter() - began)
            tpc.write_json(args.out, report)
            if final and report["runs"]:
                tpc.plot(
                    report, args.out.with_suffix(".png"), reference_tp=TP,
                    panel="TP = 4 x PP = 2 x DP = 2 (virtual)", title="coccl 3D convergence",
                )  # fmt: skip
            return report

        if todo:
            workers = tpc.start_workers(
                todo, devices, per_device, setup, work, mps.get("env", {}), SCRIPT, extra
            )
            deadline = began + args.time_limit_s
            complete = tpc.wait_for(
                workers, work, setup, deadline, log, progress=write,
                is_done=lambda j: done(work, j, setup, args),
            )  # fmt: skip
        report = write(final=True)
    for w in workers:
        if w.proc.returncode not in (0, tpc.INTERRUPTED):
            log(f"[run] worker on {w.device} failed (exit {w.proc.returncode}); its log:")
            log(w.log.read_text()[-4000:])
    print_summary(report, log)
    if report["incomplete"]:
        log(f"[run] {len(report['incomplete'])} runs not finished: the same command resumes")
        return 3
    failed = any(w.proc.returncode != 0 for w in workers)
    return 0 if complete and not failed else 1


# ---------------------------------------------------------------------------- report
def collect(
    jobs: list[Any], setup: Any, arms: list[str], seeds: list[int], mps: dict, args: Any,
    wall: float,
) -> dict[str, Any]:  # fmt: skip
    """The report of the runs finished so far (the others listed as incomplete)."""
    work: Path = args.work_dir
    finished = [j for j in jobs if done(work, j, setup, args)]
    results = [json.loads((work / f"{j.name}.json").read_text()) for j in finished]
    first = results[0] if results else {}
    summary = summarize(results, arms)
    t = summary.get(TARGET_ARM, {})
    delta, ci = t.get("delta_pct_vs_uncompressed"), t.get("delta_pct_vs_uncompressed_ci")
    met = bool(delta is not None and _finite(delta) and _finite(ci[1]))
    met = met and delta <= tpc.TARGET_DELTA_PCT and ci[1] < tpc.TARGET_CI_BELOW_PCT
    return {
        "what": (
            "final validation loss of a byte-level GPT trained at TP = 4 x PP = 2 x DP = 2, "
            "all simulated on one device (coccl.tensor_parallel.VirtualTPGroup, "
            "coccl.torch.virtual_3d.PPBoundary and VirtualDPGroup), per recipe, against the same "
            "3D run with every codec exact"
        ),
        **tpc.provenance("examples/train3d_convergence_gpu.py", args.argv, results),
        "setup": asdict(setup),
        "layout": {"tp": TP, "pp": PP, "dp": DP, "tp_algorithm": "two_shot"},
        "model": {"layers": setup.layers, "d_model": setup.d_model, "heads": setup.heads,
                  "seq": setup.seq, "params": first.get("params"), "autocast": "bfloat16"},
        "corpus": first.get("corpus"),
        "recipes": recipes(setup.d_model),
        "dp_reduce_recipe": args.dp_reduce,
        "stand_ins": args.stand_ins,
        "arms": {a: asdict(make_arm(a, setup.d_model, args.dp_reduce, args.stand_ins))
                 for a in arms},
        "payload_scoped_tp": "one payload per (rank, shard): a real group with one chunk "
                             "per shard (VirtualTPGroup)",
        "tps": [TP],
        "seeds": seeds,
        "mps": mps,
        "cuda_graph_runs": sum(bool(r.get("cuda_graph")) for r in results),
        "runs": [{k: v for k, v in r.items() if k not in ("train_losses", "setup", "corpus")}
                 for r in results],
        "incomplete": [j.name for j in jobs if j not in finished],
        "summary": summary,
        "interval": (
            "delta_pct_* = mean over seeds of 100 (L_arm,s / L_ref,s - 1), paired by seed "
            "(arms of a seed share initial weights and data order); *_ci = Student t 95% "
            "interval of those paired differences (n - 1 degrees of freedom)"
        ),
        "target": {
            "rule": f"{TARGET_ARM} delta <= +{tpc.TARGET_DELTA_PCT}% vs uncompressed, "
            f"95% interval below +{tpc.TARGET_CI_BELOW_PCT}%",
            "delta_pct": delta, "ci": ci, "met": met,
        },
        "wall_s": wall,
    }  # fmt: skip


def summarize(results: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm: n, mean and sd of the final validation loss, paired delta vs uncompressed."""
    finals: dict[str, dict[int, float]] = {}
    for r in results:
        if _finite(r["val_loss"]):
            finals.setdefault(r["arm"], {})[r["seed"]] = r["val_loss"]
    reference = finals.get("uncompressed", {})
    summary = {}
    for arm in arms:
        mine = finals.get(arm, {})
        mean, sd = stats.mean_sd(list(mine.values()))
        paired = stats.paired_delta_pct(mine, reference)
        summary[arm] = {
            "n": len(mine),
            "diverged": sum(r["arm"] == arm for r in results) - len(mine),
            "mean": mean,
            "sd": sd,
            "delta_pct_vs_uncompressed": paired["delta_pct"],
            "delta_pct_vs_uncompressed_ci": paired["ci"],
            "val_loss_by_seed": {str(s): v for s, v in sorted(mine.items())},
        }
    return summary


def print_summary(report: dict[str, Any], log: Any) -> None:
    log(f"\n{'arm':<14}{'n':>3}{'val loss':>20}{'vs uncompressed % [95%]':>32}")
    for arm, s in report["summary"].items():
        ci = s["delta_pct_vs_uncompressed_ci"]
        delta = f"{_fmt(s['delta_pct_vs_uncompressed'], '+.3f')} "
        delta += f"[{_fmt(ci[0], '+.3f')}, {_fmt(ci[1], '+.3f')}]"
        loss = f"{_fmt(s['mean'], '.4f')} +- {_fmt(s['sd'], '.4f')}"
        log(f"{arm:<14}{s['n']:>3}{loss:>20}{delta:>32}")
    t = report["target"]
    log(f"target ({t['rule']}): {'met' if t['met'] else 'NOT met'}")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if _finite(v) else "-"


# -------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str]) -> argparse.Namespace:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the experiment", formatter_class=fmt)
    run.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke)")
    run.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where to train")
    run.add_argument("--steps", type=int, default=0, help="training steps (0: the setup's)")
    run.add_argument("--arms", default=",".join(ARM_NAMES), help="comma-separated arms")
    run.add_argument("--seeds", default="0,1,2,3,4", help="seeds (weights and data order)")
    work_dir = Path(tempfile.gettempdir()) / "coccl-tp3d-convergence"
    tpc.add_runner_options(run, len(ARM_NAMES), 450.0, work_dir)
    run.add_argument(
        "--dp-reduce", choices=["intra", "inter"], default="intra", help="SDP4Bit's DP recipe"
    )
    run.add_argument(
        "--stand-ins", action="store_true", help="int8 for the int and tah codecs (smoke)"
    )
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON (PNG beside it)")
    worker = sub.add_parser("worker", help="(internal) runs in one process", formatter_class=fmt)
    worker.add_argument("--jobs", required=True, help="comma-separated run names")
    worker.add_argument("--setup", required=True, help="the Setup as JSON")
    worker.add_argument("--work-dir", type=Path, required=True, help="results and checkpoints")
    worker.add_argument("--dp-reduce", choices=["intra", "inter"], default="intra")
    worker.add_argument("--stand-ins", action="store_true")
    args = p.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return {"run": run_main, "worker": worker_main}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
