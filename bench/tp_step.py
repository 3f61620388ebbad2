"""``coccl-bench tp-step``: training-step throughput of Megatron-style TP blocks through
plain ``torch.distributed`` groups against coccl groups with each codec, in one run.

    coccl-bench tp-step --np 2 --model tiny --compressor identity,taco          # CPU ranks
    coccl-bench tp-step --np 2 --device gpu --model gpt-6.7b --compressor identity,taco,int8
    coccl-bench tp-step --np 1 --device gpu --model gpt-6.7b,gpt-2.7b --seq 2048,4096

Each arm is a process group of the TP ranks, created once: the baseline of the
transport's own backend (``nccl`` on GPUs, ``gloo`` on CPUs), then one ``coccl`` group per
``--compressor``. Every arm runs the same blocks (``coccl.bench.tp_model``: the same
weights, input and output gradient) for ``--warmup`` untimed and ``--steps`` timed steps
of forward + backward (the optimizer left out). A step is timed from a barrier to the
device's end of work; its communication is the sum of its AllReduces (CUDA events around
each on a GPU, the wall clock on the CPU), its compute the rest. Each rank's medians are
gathered and the slowest rank's are reported, as the other benchmarks do; ``speedup`` is
the baseline's step time over the arm's, in the same run. Each arm's output is compared
with the baseline's on every rank (``output_max_abs_diff``, worst rank).

With ``--tp 1`` (``--np 1``: one GPU) nothing communicates: the run measures the step's
compute, the compute of one rank's shard at TP = 2, each codec's kernels on the messages
a TP = 2 step sends, and predicts the TP = 2 step on each recorded link class
(``coccl.bench.tp_predict``; marked ``"kind": "prediction"``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

import coccl

from . import launch, tp_predict
from .cli import command, positive_int
from .codec import check_writable, codec_specs, provenance_line, record_header
from .codec import write_record as write_json
from .tp_shapes import MODELS, Context

EXIT_USAGE = 2
DTYPES = ("float32", "bfloat16", "float16")
TIMING = (
    "step: barrier to the device's end of forward + backward of the blocks (no optimizer), "
    "each rank's median over --steps; comm: the step's AllReduces (CUDA events around each "
    "on a GPU, wall clock on the CPU); compute = step - comm; the slowest rank's (by step) "
    "figures; tokens_per_s = micro_batch * seq / step, per TP group"
)


def int_list(text: str) -> list[int]:
    """argparse type: ``"2048,4096"`` -> ``[2048, 4096]`` (each >= 1, repeats dropped)."""
    values = list(dict.fromkeys(positive_int(t.strip()) for t in text.split(",") if t.strip()))
    if not values:
        raise argparse.ArgumentTypeError(f"invalid list {text!r}: give comma-separated integers")
    return values


def model_list(text: str) -> list[str]:
    """argparse type: comma-separated ``--model`` names."""
    names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown model {','.join(unknown) or text!r}: choose from {', '.join(MODELS)}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    # fmt: off
    add("--model", type=model_list, default="gpt-6.7b",
        help="comma-separated widths: tiny, gpt-2.7b, gpt-6.7b, gpt-13b, qwen2.5-7b")
    add("--layers", type=positive_int, default=2, help="transformer blocks per step")
    add("--seq", type=int_list, default="2048", help="comma-separated sequence lengths")
    add("--micro-batch", type=positive_int, default=1, help="sequences per step")
    add("--tp", type=positive_int, default=None,
        help="ranks per TP group, consecutive ranks (default: all ranks); 1: one rank's "
             "compute and the predicted TP=2 step")
    add("--compressor", type=codec_specs, default="identity,taco",
        help="comma-separated coccl arms, each name or name:key=value,... "
             "(taco:group_size=64)")
    add("--algorithm", default="auto",
        help="the coccl groups' schedule (CocclOptions.algorithm)")
    add("--min-compress-bytes", type=int, default=0,
        help="coccl groups' CocclOptions.min_compress_bytes: 0 compresses every TP "
             "AllReduce, whatever the width (the backend's own default is 64K)")
    add("--device", choices=("cpu", "gpu"), default="cpu",
        help="cpu: Gloo baseline; gpu: NCCL baseline, one GPU per rank (local rank)")
    add("--dtype", choices=DTYPES, default=None,
        help="parameters and activations (default: bfloat16 on GPU, float32 on CPU)")
    add("--steps", type=positive_int, default=10, help="timed steps per arm")
    add("--warmup", type=int, default=3, help="untimed steps per arm before them")
    add("--links", type=Path, default=None,
        help="the recorded 2-GPU AllReduce sweeps the --tp 1 prediction reads (default: "
             "bench/results/h200x2-nccl-links.json beside coccl.bench)")
    add("--json", metavar="PATH", help="write the results as JSON (bench/SCHEMA.md)")
    # fmt: on


def validate(args: argparse.Namespace) -> str | None:
    if args.warmup < 0:
        return f"--warmup must be >= 0, got {args.warmup}"
    if args.min_compress_bytes < 0:
        return f"--min-compress-bytes must be >= 0, got {args.min_compress_bytes}"
    for name in args.model:
        problem = MODELS[name].problem(args.tp or 1)
        if problem:
            return problem
    return None


@command(
    "tp-step",
    help="tokens/s of Megatron-style TP blocks: torch.distributed NCCL/Gloo vs coccl codecs",
    arguments=add_arguments,
    validate=validate,
)
def run(args: argparse.Namespace) -> int:
    """Time every arm on every (model, seq); print the tables; write the JSON record."""
    from mpi4py import MPI  # noqa: PLC0415

    mpi = MPI.COMM_WORLD
    tp = args.tp or mpi.Get_size()
    args.links = args.links or tp_predict.LINKS_FILE
    problem = _problem(args, mpi.Get_size(), tp)
    if problem:
        if mpi.Get_rank() == 0:
            print(f"coccl-bench: error: {problem}", file=sys.stderr, flush=True)
        MPI.Finalize()  # every rank refuses alike: end quietly, without MPI_Abort
        return EXIT_USAGE
    from . import tp_measure  # noqa: PLC0415 (imports torch)

    ctx = tp_measure.setup(mpi, tp, args)
    meta = _metadata(args, ctx)
    if ctx.rank == 0:
        _print_preamble(meta)
    runs = []
    groups = tp_measure.make_arms(ctx, args)
    for name in args.model:
        for seq in args.seq:
            record = tp_measure.measure_run(ctx, args, groups, name, seq)
            runs.append(record)
            if ctx.rank == 0:
                _print_run(record)
                if args.json:  # after each run, so that a run cut short keeps the rest
                    write_json(args.json, {**meta, "runs": runs})
    tp_measure.teardown()
    if ctx.rank == 0 and args.json:
        print(f"# JSON written to {args.json}", flush=True)
    finite = all(arm["finite"] for r in runs for arm in r["arms"])
    return 0 if finite else 1


def _problem(args: argparse.Namespace, world: int, tp: int) -> str | None:
    """What every rank finds wrong with the request in this world, if anything."""
    if world % tp:
        return f"--tp {tp} does not divide the {world} ranks"
    for name in args.model:  # again with the TP that --tp left to the world's size
        problem = MODELS[name].problem(tp)
        if problem:
            return problem
    if args.device == "cpu" and args.dtype not in (None, "float32", "bfloat16"):
        return f"--dtype {args.dtype} on CPU ranks: use float32 or bfloat16"
    if tp == 1:  # read now: a file without the sweeps must not wait for the measurement
        try:
            tp_predict.load_links(args.links)
        except ValueError as exc:
            return str(exc)
    try:
        check_writable(args.json)
    except Exception as exc:  # a UsageError with its message
        return str(exc)
    return None


def _metadata(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    _, launcher = launch.invocation(getattr(args, "argv", None) or [])
    gpu = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None
    return {
        **record_header(args),
        "coccl_version": coccl.__version__,
        "torch": torch.__version__,
        "launcher": launcher,
        "nranks": ctx.world,
        "tp": ctx.tp,
        "device": args.device,
        "gpu": gpu,
        "dtype": str(ctx.dtype).removeprefix("torch."),
        "layers": args.layers,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "algorithm": args.algorithm,
        "min_compress_bytes": args.min_compress_bytes,
        "compressors": {spec.label: spec.codec.get_config() for spec in args.compressor},
        "environment": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(("COCCL_", "NCCL_")) and not k.startswith("COCCL_BENCH_")
        },
        "timing": TIMING,
    }


# -------------------------------------------------------------------------- output
def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None else str(value)
    return f"{value:.{digits}f}"


def _print_preamble(meta: dict[str, Any]) -> None:
    print(
        f"# coccl-bench tp-step: {meta['nranks']} rank(s), TP {meta['tp']}, {meta['device']}"
        f"{' (' + meta['gpu'] + ')' if meta['gpu'] else ''}, {meta['dtype']}, "
        f"{meta['layers']} layer(s), micro-batch {meta['micro_batch']}, "
        f"{meta['steps']} steps after {meta['warmup']}"
    )
    print(
        f"# coccl groups: algorithm {meta['algorithm']}, min_compress_bytes "
        f"{meta['min_compress_bytes']}"
    )
    print(f"# {meta['timing']}")
    print(f"# command: {meta['command']}")
    print(provenance_line(meta), flush=True)


def _print_run(record: dict[str, Any]) -> None:
    model = record["model"]
    print(
        f"#\n# {model['name']} (h={model['hidden']}, {model['heads']} heads, "
        f"{model['kv_heads']} kv, ffn {model['ffn']}), seq {record['seq']}: "
        f"{record['allreduces_per_step']['forward'] + record['allreduces_per_step']['backward']}"
        f" AllReduces of {record['message_bytes']} B per step at TP > 1"
    )
    print(f"#{'arm':<22} {'step_ms':>10} {'compute_ms':>10} {'comm_ms':>10} "
          f"{'tokens/s':>12} {'speedup':>8} {'max|dout|':>10}")  # fmt: skip
    for arm in record["arms"]:
        print(
            f" {arm['arm']:<22} {_fmt(arm['step_ms']):>10} {_fmt(arm['compute_ms']):>10} "
            f"{_fmt(arm['comm_ms']):>10} {_fmt(arm['tokens_per_s'], 0):>12} "
            f"{_fmt(arm['speedup']):>8} {arm['output_max_abs_diff']:>10.2e}"
        )
    for cost in record["codec_costs"]:
        print(
            f"# codec {cost['codec']}: encode {cost['encode_us']:.1f} us + decode-accumulate "
            f"{cost['decode_accumulate_us']:.1f} us per message, {cost['per_step_us']:.1f} us "
            "per TP=2 step"
        )
    if record["predictions"]:
        model = record["prediction_model"]
        print(f"# PREDICTION of the TP=2 step: {model['model']}")
        print(
            f"# (compute measured here; AllReduce times of {model['links_gpu']}, "
            f"{model['links_file']})"
        )
        print(f"#{'link':<7} {'arm':<22} {'step_ms':>10} {'comm_ms':>10} {'tokens/s':>12} "
              f"{'speedup':>8}  note")  # fmt: skip
    for p in record["predictions"]:
        print(
            f" {p['link']:<7} {p['arm']:<22} {_fmt(p['step_ms']):>10} {_fmt(p['comm_ms']):>10} "
            f"{_fmt(p['tokens_per_s'], 0):>12} {_fmt(p['speedup']):>8}  {p['note'] or ''}"
        )
    sys.stdout.flush()
