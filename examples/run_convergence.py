"""The TP convergence experiment: one GPT, one seed, one data order, many wire codecs.

Runs examples/tp_gpt.py as a PyTorch-only single-process baseline and then, under
``mpiexec -n TP``, once per (compressor, algorithm) configuration; collects each run's
final validation loss and its change from the baseline, and writes

    bench/results/tp-convergence.json   {baseline, runs, command, date, commit, device, ...}
    bench/results/tp-convergence.png    validation loss curves and their gap to the baseline

    python examples/run_convergence.py --steps 300            # the default set of runs
    python examples/run_convergence.py --steps 20 --only identity,taco --name scratch
    python examples/run_convergence.py --seeds 1,2 --only taco,int8 --name tp-convergence-seeds

Runs go one after another (the ranks of one run already use every core).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "tp_gpt.py"
TARGET_PCT = 0.5  # the target: taco within +0.5% of the baseline's val loss


@dataclass(frozen=True)
class Run:
    """One TP configuration: a label, the TP size and the wire settings."""

    label: str
    tp: int
    compressor: str  # as tp_gpt.py's --tp-compressor takes it
    algorithm: str

    @property
    def codec_id(self) -> str:
        return self.compressor.partition(":")[0]


def default_runs(tp: int, ring_tp: int) -> list[Run]:
    """identity (must match the baseline), taco, int8, taco's two ablations, and taco on
    ring vs two-shot. At TP = 2 ring and two-shot both quantize each element twice, so
    the ring-vs-two-shot pair is run (also) at ``ring_tp`` ranks, where a ring quantizes
    ``ring_tp`` times and two-shot still twice."""
    runs = [
        Run("identity", tp, "identity", "two_shot"),
        Run("taco", tp, "taco", "two_shot"),
        Run("int8", tp, "int8", "two_shot"),
        Run("taco-no-ash", tp, "taco:ash=false", "two_shot"),
        Run("taco-no-dual-scale", tp, "taco:dual_scale=false", "two_shot"),
        Run("taco-ring", tp, "taco", "ring"),
    ]
    if ring_tp and ring_tp != tp:
        runs += [
            Run(f"identity-tp{ring_tp}", ring_tp, "identity", "two_shot"),
            Run(f"taco-tp{ring_tp}", ring_tp, "taco", "two_shot"),
            Run(f"taco-ring-tp{ring_tp}", ring_tp, "taco", "ring"),
        ]
    return runs


def mpiexec() -> list[str]:
    """mpiexec beside this Python (the mpich wheel's), else on PATH; Open MPI's flags for
    small machines and root (as tests/mpi_launch.py does)."""
    local = Path(sys.executable).parent / "mpiexec"
    exe = str(local) if local.exists() else "mpiexec"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    flags: list[str] = []
    if "Open MPI" in version or "OpenRTE" in version:
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return [exe, *flags]


def run_one(cmd: list[str], out: Path, label: str) -> dict[str, Any]:
    """Run one training, stream its log, return its result JSON."""
    print(f"\n=== {label}: {shlex.join(cmd)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{label} failed (exit {proc.returncode}):\n{proc.stdout}")
    result = json.loads(out.read_text())
    result["process_wall_s"] = elapsed
    print(f"=== {label}: val_loss {result['val_loss']:.4f} in {elapsed:.0f} s", flush=True)
    return result


def codec_sources_digest() -> str:
    """SHA-256 over the codec sources the runs imported (compressors/*.py, *.cu) and the
    virtual-rank simulator that cuts their payloads (algorithms/virtual_ranks.py): with a
    dirty working tree, the commit alone does not say which code ran."""
    h = hashlib.sha256()
    folder = ROOT / "compressors"
    sources = [*folder.glob("*.py"), *folder.glob("*.cu")]
    for path in [*sorted(sources), ROOT / "algorithms" / "virtual_ranks.py"]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def registered_compressors() -> set[str]:
    """coccl's codecs, asked in a child process: importing coccl here would initialise
    MPI in this process, and an Open MPI singleton's environment breaks the mpiexec
    launched from it."""
    code = "import json, coccl; print(json.dumps(coccl.available_compressors()))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=SCRIPT.parent, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cannot import coccl:\n{proc.stderr}")
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def device_name(device: str) -> str:
    if device == "cuda":
        import torch  # noqa: PLC0415

        return f"cuda: {torch.cuda.get_device_name(0)}"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} cores)"


def git_commit() -> tuple[str, bool]:
    """HEAD, and whether the working tree had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() or "unknown", bool(status.stdout.strip())


def plot(report: dict[str, Any], path: Path) -> None:
    """Validation loss per step for every run, and its gap to the baseline in percent."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    base = report["baseline"]["history"]
    base_steps = [h["step"] for h in base]
    base_val = {h["step"]: h["val_loss"] for h in base}
    fig, (ax, gap) = plt.subplots(1, 2, figsize=(13, 5))
    ax.plot(base_steps, [h["val_loss"] for h in base], "k-", lw=2.5, label="baseline (PyTorch)")
    markers = "osv^D<>Px*"  # runs that coincide (taco ring and two-shot at TP=2) stay visible
    for i, run in enumerate(report["runs"]):
        steps = [h["step"] for h in run["history"]]
        vals = [h["val_loss"] for h in run["history"]]
        style = {
            "ls": "--" if run["tp"] != report["tp"] else "-",
            "marker": markers[i % len(markers)],
            "ms": 4,
            "lw": 1.2,
            "label": f"{run['label']} (TP={run['tp']}, {run['algorithm']})",
        }
        line = ax.plot(steps, vals, **style)[0]
        gaps = [100 * (v - base_val[s]) / base_val[s] for s, v in zip(steps, vals, strict=True)]
        gap.plot(steps, gaps, color=line.get_color(), **style)
    m = report["model"]
    ax.set(
        xlabel="step",
        ylabel="validation loss (nats/byte)",
        title=f"byte-level GPT, {m['params'] / 1e6:.2f} M params, {m['layers']} layers, "
        f"d={m['d_model']}",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    gap.axhline(0.0, color="k", lw=1)
    gap.axhline(TARGET_PCT, color="grey", ls=":", lw=1, label=f"+{TARGET_PCT}% target")
    gap.set(xlabel="step", ylabel="val loss vs baseline (%)", title="gap to the baseline")
    gap.legend(fontsize=8)
    gap.grid(alpha=0.3)
    fig.suptitle(f"tensor-parallel training on coccl: {report['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_report(
    baseline: dict[str, Any],
    results: list[tuple[Run, dict[str, Any]]],
    meta: dict[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    """The JSON report: the baseline, every run with its change from the baseline, the
    experiment's settings and provenance."""
    base_val = baseline["val_loss"]
    runs = [
        {
            "label": run.label,
            "compressor": res["compressor"],
            "algorithm": run.algorithm,
            "tp": run.tp,
            "val_loss": res["val_loss"],
            "delta_pct": 100.0 * (res["val_loss"] - base_val) / base_val,
            "train_loss": res["train_loss"],
            "replicated_identical": res["replicated_identical"],
            "replicated_params": res["replicated_params"],
            "wall_s": res["process_wall_s"],
            "train_wall_s": res["wall_s"],
            "history": res["history"],
        }
        for run, res in results
    ]
    target = dict(meta["target"])
    taco = [r for r in runs if r["label"] == "taco"]
    if taco:
        target["met"] = taco[0]["delta_pct"] <= target["max_delta_pct"]
    return {
        "baseline": {
            "val_loss": base_val,
            "train_loss": baseline["train_loss"],
            "wall_s": baseline["process_wall_s"],
            "train_wall_s": baseline["wall_s"],
            "history": baseline["history"],
        },
        "runs": runs,
        **meta,
        "target": target,
        "model": baseline["model"],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall_s,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2, help="TP size of the main runs")
    p.add_argument(
        "--ring-tp",
        type=int,
        default=4,
        help="TP size of the ring-vs-two-shot pair (0: none beyond --tp)",
    )
    p.add_argument("--only", default="", help="comma-separated run labels to run")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument(
        "--seeds",
        default="1234",
        help="comma-separated; the table is the first seed's, further seeds repeat every "
        "run to show how much the seed alone moves each comparison",
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=160)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", default="tp-convergence", help="basename of the JSON and PNG")
    return p.parse_args(argv)


def seed_summary(per_seed: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Each run's change from its own seed's baseline, over the seeds: a codec's effect
    is only meaningful against how much a different seed alone moves a comparison."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for seed, report in per_seed:
        for r in report["runs"]:
            by_label.setdefault(r["label"], []).append(
                {"seed": seed, "val_loss": r["val_loss"], "delta_pct": r["delta_pct"]}
            )
    summary: dict[str, Any] = {
        "seeds": [seed for seed, _ in per_seed],
        "baseline_val_loss": {str(seed): rep["baseline"]["val_loss"] for seed, rep in per_seed},
        "runs": {},
    }
    for label, rows in by_label.items():
        deltas = [row["delta_pct"] for row in rows]
        mean = sum(deltas) / len(deltas)
        std = (sum((d - mean) ** 2 for d in deltas) / max(1, len(deltas) - 1)) ** 0.5
        summary["runs"][label] = {"per_seed": rows, "delta_pct_mean": mean, "delta_pct_std": std}
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = default_runs(args.tp, args.ring_tp)
    if args.only:
        wanted = set(args.only.split(","))
        runs = [r for r in runs if r.label in wanted]
    available = registered_compressors()
    skipped = [
        {"label": r.label, "reason": f"compressor {r.codec_id!r} is not registered"}
        for r in runs
        if r.codec_id not in available
    ]
    runs = [r for r in runs if r.codec_id in available]

    commit, dirty = git_commit()
    meta = {
        "skipped": skipped,
        "target": {"compressor": "taco", "max_delta_pct": TARGET_PCT},
        "tp": args.tp,
        "steps": args.steps,
        "seed": seeds[0],
        "batch": args.batch,
        "lr": args.lr,
        "data": "CPython pydoc_data.topics, bytes, last 10% held out; "
        f"val_loss = mean over {args.val_batches} fixed batches of {args.batch} x {args.seq}",
        "command": shlex.join(["python", "examples/run_convergence.py", *(argv or sys.argv[1:])]),
        "commit": commit,
        "worktree_dirty": dirty,
        "compressors_sha256": codec_sources_digest(),
        "device": device_name(args.device),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / f"{args.name}.json"
    started = time.perf_counter()
    per_seed: list[tuple[int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seed in seeds:
            model_flags = [
                "--steps", str(args.steps), "--seed", str(seed), "--layers", str(args.layers),
                "--d-model", str(args.d_model), "--heads", str(args.heads),
                "--seq", str(args.seq), "--batch", str(args.batch), "--lr", str(args.lr),
                "--val-batches", str(args.val_batches), "--log-every", str(args.log_every),
                "--device", args.device, "--threads", str(args.threads),
            ]  # fmt: skip
            base_cmd = [sys.executable, str(SCRIPT), "--baseline", *model_flags]
            baseline = run_one(base_cmd, work / f"s{seed}-baseline.json", f"baseline seed {seed}")
            results: list[tuple[Run, dict[str, Any]]] = []
            per_seed.append((seed, build_report(baseline, results, meta, 0.0)))
            for i, run in enumerate(runs):
                cmd = [
                    *mpiexec(), "-n", str(run.tp), sys.executable, "-m", "mpi4py", str(SCRIPT),
                    *model_flags,
                    "--tp-compressor", run.compressor, "--tp-algorithm", run.algorithm,
                ]  # fmt: skip
                out = work / f"s{seed}-run{i}.json"
                results.append((run, run_one(cmd, out, f"{run.label} seed {seed}")))
                # Rewritten after every run: an interrupted experiment keeps what it measured.
                elapsed = time.perf_counter() - started
                per_seed[-1] = (seed, build_report(baseline, results, meta, elapsed))
                report = {**per_seed[0][1], "wall_s": elapsed}
                report["complete"] = seed == seeds[-1] and i + 1 == len(runs)
                report["compressors_changed_during_run"] = (
                    codec_sources_digest() != meta["compressors_sha256"]
                )
                if len(seeds) > 1:
                    report["seed_replicates"] = seed_summary(per_seed)
                json_path.write_text(json.dumps(report, indent=1) + "\n")
                plot(report, args.out_dir / f"{args.name}.png")
    total = time.perf_counter() - started

    for seed, rep in per_seed:
        print(f"\nseed {seed}: baseline val_loss {rep['baseline']['val_loss']:.4f}")
        print(f"{'run':<22}{'TP':>3}  {'algorithm':<9}{'val_loss':>10}{'delta %':>9}  replicas")
        for r in rep["runs"]:
            same = "identical" if r["replicated_identical"] else "DIFFER"
            print(
                f"{r['label']:<22}{r['tp']:>3}  {r['algorithm']:<9}{r['val_loss']:>10.4f}"
                f"{r['delta_pct']:>+9.3f}  {same}"
            )
    if len(seeds) > 1:
        print("\ndelta % over seeds (mean +- std):")
        for label, row in seed_summary(per_seed)["runs"].items():
            print(f"{label:<22}{row['delta_pct_mean']:+.3f} +- {row['delta_pct_std']:.3f}")
    for s in skipped:
        print(f"{s['label']:<22}skipped: {s['reason']}")
    print(f"total wall time {total:.0f} s; wrote {json_path} and the PNG beside it")
    ok = all(r["replicated_identical"] for _, rep in per_seed for r in rep["runs"])
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
