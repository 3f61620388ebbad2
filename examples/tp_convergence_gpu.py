"""The TP convergence experiment on GPUs: does TACO train a GPT as well as no compression?

Every run trains the byte-level GPT of ``tp_gpt.py`` (4 layers, d = 768, 8 heads, context
256: 28.9 M parameters) for 2000 steps of 8 x 256 bytes in bfloat16 autocast with AdamW
(peak lr 6e-4, 100 warm-up steps, cosine to 10%), on the Python standard library's own
sources (``stdlib_corpus.py``: about 30 MB, 5% of the files held out; a run reads 4.1 M
distinct bytes, no window twice). Arms, each for seeds 0, 1, 2:

    uncompressed        the plain model, no tensor parallelism (TP = 1)
    identity            TP, two_shot, exact float32 sums (the TP arithmetic alone)
    taco                TP, two_shot, TACO FP8 (ASH and dual scale)
    taco_ring           TP, ring, TACO FP8 (n quantizations per element instead of 2)
    taco_no_ash         TP, two_shot, TACO without the Hadamard/alpha (plain group FP8)
    taco_no_dual_scale  TP, two_shot, TACO without the post-rotation scale s
    int8                TP, two_shot, per-group INT8

and every TP arm at TP = 4 and TP = 8. The ``frontier`` command (issue #33: the fewest
bytes per element within +0.5% of uncompressed, the interval's upper end below +1%) runs
uncompressed, taco and the 4-6-bit codecs, all two_shot:

    mxfp6               mx e2m3, block 32, E8M0 scales (MXFP6; e2m3 rather than e3m2: half
                        the error on the recorded TP tensors, cpu-fidelity-real.json)
    mxfp4               mx e2m1, block 32, E8M0 scales (MXFP4)
    nvfp4               mx e2m1, block 16, E4M3 scales and a float32 one per payload
    taco_fp6, taco_fp4  taco_fp e2m3 / e2m1, group 128 (TACO's ASH and dual scale)
    int4_h32            int, 4 bits, group 128, Hadamard blocks of 32
    fwd_nvfp4_bwd_taco  nvfp4 on the forward AllReduces (activations, bfloat16), taco on
                        the backward ones (input gradients, float32)
    fwd_taco_bwd_nvfp4  the other way round
    fwd_mxfp6_bwd_nvfp4 mxfp6 forward, nvfp4 backward

and writes bench/results/tp-frontier-gpu.json (the same report plus ``frontier``: per arm
and TP size the codec's payload bytes per element forward, backward and their mean, the
paired delta and its interval, whether it meets the target; ``tp_frontier.py``), its PNG
(bytes per element against the delta) and the loss curves beside it (``-curves.png``). The
TP ranks are virtual
(``coccl.tensor_parallel.VirtualTPGroup``): one process holds every rank's shards, computes
every rank's partial products with the calls a real rank makes, and sums them with
``coccl.virtual_ranks.simulate_allreduce``, bitwise a real coccl AllReduce (tests/; for
NVFP4, whose float32 scale is per payload, a real group with one chunk per shard: the
``VirtualTPGroup`` default; runs recorded before that fix put every rank's shards of an
AllReduce in one payload, one scale across the group). So a
run is one process on one GPU, and many run side by side. Arms that share a seed share
the initial weights and the data order: deltas are paired by seed
(``convergence_stats.py`` says how).

Phases, one command each (2 H200s, 32 cores):

    # 1. the experiment: 39 runs, all at once (about 4-5 minutes, see below); writes
    #    bench/results/tp-convergence-gpu.json and .png
    python examples/tp_convergence_gpu.py run
    # 2. the simulator against a real TP = 2 run over NCCL (two GPUs, mpiexec -n 2), the
    #    same arm, seed and steps: loss histories compared step by step (about 1-2 min)
    python examples/tp_convergence_gpu.py check
    # the whole pipeline in seconds on a CPU (what CI runs)
    python examples/tp_convergence_gpu.py run --smoke --out /tmp/s.json
    # 3. the frontier on ONE H200, in one call of at most 540 s (bench/scripts/
    #    h200_check.sh part frontier): 8 arms x TP 4 x 5 seeds, taco at TP 4 and 8, the
    #    plain model: 55 runs, 10 workers (the defaults of ``frontier``)
    python examples/tp_convergence_gpu.py frontier --tps 4,8 --only 8=taco \
        --seeds 0,1,2,3,4 --jobs-per-gpu 10 --time-limit-s 480
    # 4. the same again with a wider --only (e.g. 8=taco+nvfp4+int4_h32) adds TP = 8 runs;
    #    finished runs in --work-dir are kept, so it runs only the new ones
    # 5. the candidates with more seeds (h200_check.sh part tpseeds): the 5-seed report's
    #    runs written into the work folder first (bench/scripts/prepopulate_runs.py), then
    #    --arms uncompressed,taco,nvfp4,fwd_mxfp6_bwd_nvfp4,mxfp6 --tps 4 --seeds 0,...,26

``run`` writes each run to ``--work-dir`` as it finishes and stops at ``--time-limit-s``
(workers save a checkpoint on SIGTERM); the same command again resumes. ``run`` starts an
MPS daemon when it can (``--mps``), and captures each run's training step in a CUDA
graph after 3 eager steps (``--cuda-graph``; a failed capture falls back to eager steps
and is recorded in the run's row).

The work, counted (``python examples/tp_convergence_gpu.py estimate`` prints it): a
training step is 6 x 28.9 M x 2048 = 0.36 TFLOP of matmuls (TP does not change the
total; it splits each linear into TP smaller ones) and 16 AllReduces (2 per block forward
over bfloat16 partial products, 2 backward over float32 partial input gradients) of
2048 x 768 = 1.57 M elements. A simulated AllReduce of n ranks is 2n + 4 array
operations for two_shot (a stack, one encode and one decode of all n contributions,
2 (n - 1) additions in each owner's order, one final encode and decode) and about 3n + 2
for the ring (a gather and a fused hop kernel per hop), moving about 25 n bytes per
element: at TP = 8, 16 x 0.3 GB = 5 GB per step. Every rank's linears are separate
calls, as on real ranks (bitwise parity), so a TP = 8 step is about 1650 kernels (TP = 4
about 900, the plain model about 300). Assumed on an H200: matmuls at 150 TFLOP/s
(these shapes are small), memory at 2.5 TB/s, 2.5 us per kernel inside a CUDA graph.
Then a TP = 8 step takes 2.4 + 2.0 + 4.1 = ~8.5 ms (2000 steps: ~17 s), TP = 4 ~5.5 ms
(~11 s), the plain model ~2.5 ms (~5 s); with evaluations (20 x 8 batches and a final
64) about 4% more. Per GPU, 9 TP = 8 runs, 9 TP = 4 runs and 1-2 plain ones: ~270 s if
the GPU ran them one kernel at a time; under MPS the small kernels of the 20 processes
overlap and the bound is closer to the matmul and memory time (~150 s). Start-up (torch,
CuPy, codec kernel compilation, corpus) is ~30-60 s. So about 4-5 minutes, within the
6-minute budget; if the estimate is off, ``--time-limit-s`` (480) stops the runs at a
checkpoint with time to save them, and the same command resumes.

The frontier's plan, from the recorded table's rates (8 runs sharing an H200 under MPS:
about 32 steps/s each at TP = 4, 23 at TP = 8, so one H200 does about 256 TP = 4 steps/s,
184 TP = 8 steps/s): 45 TP = 4 runs take ~350 s of the GPU, 5 TP = 8 runs ~55 s, 5 plain
ones ~10 s: ~415 s, plus ~45 s start-up, if the new codecs cost what taco costs. Their
kernels are slower per byte (bench/NOTES.md: the mx and taco_fp ones at 0.02-0.25 of a
copy) but launch few threads on these 1.6 M-element messages, leaving the GPU to the other
runs under MPS; if they stretch the runs past ``--time-limit-s`` the runs stop at a
checkpoint, the report holds the finished ones (``incomplete`` lists the rest), and the
same command resumes. Every frontier arm at TP = 8 too (40 more runs, ~440 s) needs a
second call of the same length.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:  # the sibling example modules, also when imported by tests
    sys.path.insert(0, str(HERE))

import convergence_stats as stats  # noqa: E402
import stdlib_corpus  # noqa: E402
import tp_frontier  # noqa: E402
from run_convergence import codec_sources_digest, git_commit, mpiexec  # noqa: E402

SCRIPT = Path(__file__).resolve()
DEFAULT_OUT = ROOT / "bench" / "results" / "tp-convergence-gpu.json"
DEFAULT_FRONTIER_OUT = ROOT / "bench" / "results" / "tp-frontier-gpu.json"
TARGET_DELTA_PCT = 0.5  # the issue's target for taco: at most +0.5% ...
TARGET_CI_BELOW_PCT = 1.0  # ... with a 95% interval that excludes +1%
INTERRUPTED = 75  # a worker's exit status when it stopped at a checkpoint (EX_TEMPFAIL)


# ---------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Arm:
    """A wire configuration: ``compressor`` None is the plain, non-TP model.

    ``backward`` None: ``compressor`` carries both directions; else ``compressor`` the
    forward AllReduces (the activations, bfloat16) and ``backward`` the backward ones
    (the input gradients, float32): ``tp_gpt.parallelize``'s ``backward_group``."""

    name: str
    compressor: dict[str, Any] | None
    algorithm: str | None
    backward: dict[str, Any] | None = None

    @property
    def record(self) -> dict[str, Any]:
        """The arm's wire fields in a run's row and the report (``backward_compressor``
        only where the directions differ)."""
        fields = {"algorithm": self.algorithm, "compressor": self.compressor}
        return fields if self.backward is None else {**fields, "backward_compressor": self.backward}


NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
MXFP6 = {"id": "mx", "element": "e2m3", "block": 32, "scale": "e8m0"}
ARMS = {
    arm.name: arm
    for arm in (
        Arm("uncompressed", None, None),
        Arm("identity", {"id": "identity"}, "two_shot"),
        Arm("taco", {"id": "taco"}, "two_shot"),
        Arm("taco_ring", {"id": "taco"}, "ring"),
        Arm("taco_no_ash", {"id": "taco", "ash": False}, "two_shot"),
        Arm("taco_no_dual_scale", {"id": "taco", "dual_scale": False}, "two_shot"),
        Arm("int8", {"id": "int8"}, "two_shot"),
        # the frontier of issue #33 (the ``frontier`` command): 4-6 bits per element
        Arm("mxfp6", MXFP6, "two_shot"),
        Arm("mxfp4", {"id": "mx", "element": "e2m1", "block": 32, "scale": "e8m0"}, "two_shot"),
        Arm("nvfp4", NVFP4, "two_shot"),
        Arm("taco_fp6", {"id": "taco_fp", "element": "e2m3", "group_size": 128}, "two_shot"),
        Arm("taco_fp4", {"id": "taco_fp", "element": "e2m1", "group_size": 128}, "two_shot"),
        Arm("int4_h32", {"id": "int", "bits": 4, "group_size": 128, "hadamard": 32}, "two_shot"),
        Arm("fwd_nvfp4_bwd_taco", NVFP4, "two_shot", {"id": "taco"}),
        Arm("fwd_taco_bwd_nvfp4", {"id": "taco"}, "two_shot", NVFP4),
        Arm("fwd_mxfp6_bwd_nvfp4", MXFP6, "two_shot", NVFP4),
    )
}
# ``run``'s arms (the recorded table); ``frontier`` runs FRONTIER_ARMS
DEFAULT_ARMS = list(ARMS)[:7]
FRONTIER_ARMS = ["uncompressed", "taco", *list(ARMS)[7:]]


@dataclass(frozen=True)
class Setup:
    """Everything that makes two runs of an arm and seed the same run."""

    layers: int = 4
    d_model: int = 768
    heads: int = 8
    seq: int = 256
    batch: int = 8
    steps: int = 2000
    lr: float = 6e-4
    eval_every: int = 100
    eval_batches: int = 8  # per evaluation during training (the history; every 8th)
    final_eval_batches: int = 64  # for the final validation loss
    device: str = "cuda"
    cuda_graph: str = "auto"  # "auto": capture, fall back to eager steps; "on"; "off"
    deterministic: bool = False  # torch.use_deterministic_algorithms (the check sets it)
    eager_steps: int = 3  # steps before the capture (PyTorch's warm-up recipe)


FULL = Setup()
SMOKE = Setup(
    layers=2,
    d_model=64,
    heads=8,
    seq=32,
    batch=4,
    steps=4,
    lr=1e-3,
    eval_every=2,
    eval_batches=2,
    final_eval_batches=3,
    device="cpu",
    cuda_graph="off",
)


@dataclass(frozen=True)
class Job:
    """One run: an arm at a TP size (1 for the plain model) and a seed."""

    arm: str
    tp: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}-tp{self.tp}-seed{self.seed}"

    @property
    def cost(self) -> float:
        """Relative duration, to start the longest runs first."""
        return self.tp * (1.2 if ARMS[self.arm].algorithm == "ring" else 1.0)


def experiment_jobs(
    arms: list[str], tps: list[int], seeds: list[int], only: dict[int, list[str]] | None = None
) -> list[Job]:
    """Every (arm, TP, seed) run, seed by seed (so the arms of a seed finish together and a
    cut-off table still pairs them), a seed's longest first; ``only`` maps a TP size to
    the arms that run at it (the others run at every TP of ``tps``)."""
    jobs = []
    for arm in arms:
        for tp in [1] if ARMS[arm].compressor is None else tps:
            if only and tp in only and arm not in only[tp]:
                continue
            jobs += [Job(arm, tp, seed) for seed in seeds]
    return sorted(jobs, key=lambda j: (j.seed, -j.cost, j.name))


def parse_only(text: str) -> dict[int, list[str]]:
    """``--only 8=identity+taco`` -> ``{8: ["identity", "taco"]}`` (several: comma-separated)."""
    only: dict[int, list[str]] = {}
    for item in filter(None, text.split(",")):
        tp, _, arms = item.partition("=")
        only[int(tp)] = arms.split("+")
    return only


# ---------------------------------------------------------------------------- training
def train(
    job: Job,
    setup: Setup,
    group: Any,
    device: Any,
    checkpoint: Path | None,
    stop: Callable[[], bool],
    log: Callable[[str], None],
    build: Callable[..., tuple[Any, Any, Callable[[], Any]]] | None = None,
    arm_fields: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Train one run; its result, or None when ``stop()`` asked for a checkpoint.

    ``group``: a VirtualTPGroup or TPGroup, or None for the plain model. The step is
    captured in a CUDA graph after ``setup.eager_steps`` eager steps when
    ``setup.cuda_graph`` allows it (autocast runs without its cast cache either way, as
    graphs need, so both modes compute the same).

    ``build(model, group, device, lr, x, y, autocast)`` turns the full model into
    ``(model, optimizer, step)`` (default :func:`plain_build`; another harness passes its
    own, e.g. a 3D-parallel one); ``arm_fields`` replaces the arm's algorithm and
    compressor in the result.
    """
    import torch  # noqa: PLC0415
    import tp_gpt  # noqa: PLC0415

    from coccl.tensor_parallel import is_tp_sharded  # noqa: PLC0415

    if arm_fields is None:
        arm_fields = ARMS[job.arm].record
    identity = run_identity(setup, arm_fields)
    corpus = stdlib_corpus.load_stdlib_corpus()
    cfg = tp_gpt.GPTConfig(setup.layers, setup.d_model, setup.heads, setup.seq)
    x = torch.zeros(setup.batch, setup.seq, dtype=torch.long, device=device)
    y = torch.zeros_like(x)

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)

    torch.manual_seed(job.seed)
    model = tp_gpt.GPT(cfg)  # the full weights: every arm of a seed starts from them
    params = sum(p.numel() for p in model.parameters())
    lr = torch.tensor(setup.lr, device=device)  # a tensor: a captured step reads it
    model, opt, step_fn = (build or plain_build)(model, group, device, lr, x, y, autocast)
    windows = stdlib_corpus.train_windows(
        corpus.train, setup.seq, setup.batch, setup.steps, job.seed
    )
    data = torch.from_numpy(windows).to(device)
    val = torch.from_numpy(
        stdlib_corpus.val_windows(corpus.val, setup.seq, setup.batch, setup.final_eval_batches)
    ).to(device)
    losses = torch.zeros(setup.steps, device=device)  # every step's training loss
    history: list[dict[str, float]] = []
    start, resumed_at = 0, None
    state = None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device, weights_only=False)
        if state.get("identity") != identity:  # another configuration's run: start anew
            log(f"[{job.name}] {checkpoint} is of another setup or arm: not resumed")
            state = None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        for g in opt.param_groups:
            g["lr"] = lr  # the one tensor the step reads
        losses.copy_(state["losses"])
        history, start = state["history"], state["step"]
        resumed_at = start
        log(f"[{job.name}] resumed at step {start}")

    @torch.no_grad()
    def evaluate(batches: int) -> float:
        """Mean loss over ``batches`` of the validation batches, spread over all of them."""
        model.eval()
        total = torch.zeros((), device=device)
        stride = setup.final_eval_batches // batches
        for b in range(0, stride * batches, stride):
            with autocast():
                logits = model(val[b, :, :-1].long())
                total += torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), val[b, :, 1:].long().flatten()
                )
        model.train()
        return total.item() / batches

    use_graph = device.type == "cuda" and setup.cuda_graph != "off"
    side = torch.cuda.Stream() if use_graph else None
    graph = static_loss = graph_error = None
    began = time.perf_counter()
    last_eval = history[-1]["step"] if history else 0
    for step in range(start, setup.steps):
        if stop():
            torch.save(
                {
                    "step": step,
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "losses": losses.cpu(),
                    "history": history,
                    "identity": identity,
                },
                checkpoint,
            )
            log(f"[{job.name}] stopped at step {step}; checkpoint {checkpoint}")
            return None
        lr.fill_(tp_gpt.lr_at(step, setup.steps, setup.lr))
        x.copy_(data[step, :, :-1])
        y.copy_(data[step, :, 1:])
        if graph is not None:
            graph.replay()
            losses[step].copy_(static_loss)
        elif use_graph:  # warm-up steps on a side stream (PyTorch's capture recipe)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                opt.zero_grad(set_to_none=True)
                loss = step_fn()
            torch.cuda.current_stream().wait_stream(side)
            losses[step].copy_(loss)
            if step + 1 - start >= setup.eager_steps and step + 1 < setup.steps:
                try:
                    opt.zero_grad(set_to_none=True)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_loss = step_fn()
                except Exception as exc:  # recorded in the run's row, never silent
                    if setup.cuda_graph == "on":
                        raise
                    graph, use_graph, graph_error = None, False, f"{type(exc).__name__}: {exc}"
                    opt.zero_grad(set_to_none=True)
                    log(f"[{job.name}] CUDA graph capture failed, eager steps: {graph_error}")
        else:
            opt.zero_grad(set_to_none=True)
            losses[step].copy_(step_fn())
        if (step + 1) % setup.eval_every == 0 or step + 1 == setup.steps:
            train_loss = losses[last_eval : step + 1].mean().item()
            history.append(
                {
                    "step": step + 1,
                    "train_loss": train_loss,
                    "val_loss": evaluate(setup.eval_batches),
                }
            )
            last_eval = step + 1
            log(
                f"[{job.name}] step {step + 1:5d}  train {train_loss:.4f}  "
                f"val {history[-1]['val_loss']:.4f}  "
                f"{(step + 1 - start) / (time.perf_counter() - began):.1f} steps/s"
            )
    val_loss = evaluate(setup.final_eval_batches)
    wall = time.perf_counter() - began
    replicated = hashlib.sha256()  # what every real TP rank must hold alike
    for name, p in model.named_parameters():
        if not is_tp_sharded(p):
            replicated.update(name.encode() + p.detach().cpu().numpy().tobytes())
    return {
        "arm": job.arm,
        "seed": job.seed,
        "tp": job.tp,
        **arm_fields,
        "params": params,
        "tokens": setup.steps * setup.batch * setup.seq,
        "val_loss": val_loss,
        "history": history,
        "train_losses": losses.cpu().tolist(),
        "wall_s": wall,
        "steps_per_s": (setup.steps - start) / wall,
        "resumed_at": resumed_at,
        "replicated_sha256": replicated.hexdigest(),
        "cuda_graph": graph is not None,
        "cuda_graph_error": graph_error,
        "device": _device_name(device),
        "versions": _versions(),
        "setup": asdict(setup),
        "corpus": corpus.info,
    }


def plain_build(
    model: Any,
    group: Any,
    device: Any,
    lr: Any,
    x: Any,
    y: Any,
    autocast: Callable[[], Any],
    backward_group: Any = None,
) -> tuple[Any, Any, Callable[[], Any]]:
    """The model on ``device`` (its TP shards over ``group`` unless None; the backward
    AllReduces over ``backward_group`` when given), its AdamW and the training step on
    the batch ``x``, ``y``: the loss, its backward, the update."""
    import torch.nn.functional as F  # noqa: N812, PLC0415
    import tp_gpt  # noqa: PLC0415

    if group is not None:
        model = tp_gpt.parallelize(model, group, backward_group)
    model.to(device)
    opt = tp_gpt.make_optimizer(model, lr, fused=True, capturable=True)

    def step_fn() -> Any:
        with autocast():
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, step_fn


def arm_build(arm: Arm, make_group: Callable[[dict[str, Any]], Any]) -> Callable[..., Any] | None:
    """``train``'s ``build`` for ``arm``: None (:func:`plain_build`) when one codec carries
    both directions, else plain_build with a backward group of ``make_group(backward)``."""
    if arm.backward is None:
        return None
    return functools.partial(plain_build, backward_group=make_group(arm.backward))


def _device_name(device: Any) -> str:
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores)"


def _versions() -> dict[str, str | None]:
    import platform  # noqa: PLC0415

    import torch  # noqa: PLC0415

    cupy = sys.modules.get("cupy")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cupy": getattr(cupy, "__version__", None),
    }


def configure_torch(setup: Setup, threads: int = 1) -> Any:
    """Threads, determinism and the device of a training process."""
    if setup.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import numba  # noqa: PLC0415
    import torch  # noqa: PLC0415

    # numba's OpenMP layer shares the OpenMP runtime with torch and resets its thread
    # count when it starts (tp_gpt.py says more): start it first, then set torch's.
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    if setup.deterministic:
        # warn_only: an operation without a deterministic kernel warns instead of
        # stopping the run (the check then reports where the runs part)
        torch.use_deterministic_algorithms(True, warn_only=True)
    if setup.device == "cuda":
        local = int(
            os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0"))
        )
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ----------------------------------------------------------------------------- worker
def worker_main(args: argparse.Namespace) -> int:
    """Run ``args.jobs`` one after another in this process, on virtual TP ranks."""
    from coccl.tensor_parallel import VirtualTPGroup  # noqa: PLC0415

    setup = Setup(**json.loads(args.setup))
    device = configure_torch(setup)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    work = args.work_dir
    for name in args.jobs.split(","):
        arm, tp, seed = _parse_job(name)
        job = Job(arm, tp, seed)
        out = work / f"{job.name}.json"
        if done(work, job, setup):
            continue
        a = ARMS[arm]
        group = None if a.compressor is None else VirtualTPGroup(tp, a.algorithm, a.compressor)
        result = train(
            job,
            setup,
            group,
            device,
            work / f"{job.name}.ckpt",
            lambda: stopping["now"],
            lambda msg: print(msg, flush=True),
            build=arm_build(a, functools.partial(VirtualTPGroup, tp, a.algorithm)),
        )
        if result is None:
            return INTERRUPTED
        write_json(out, result)
        (work / f"{job.name}.ckpt").unlink(missing_ok=True)
    return 0


def _parse_job(name: str) -> tuple[str, int, int]:
    arm, tp, seed = name.rsplit("-", 2)
    return arm, int(tp.removeprefix("tp")), int(seed.removeprefix("seed"))


def run_identity(setup: Setup, fields: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs of one job name the same run: the setup and the arm's fields
    (its algorithm and codecs), as JSON holds them."""
    return json.loads(json.dumps(_jsonable({"setup": asdict(setup), **fields})))


def finished(path: Path, setup: Setup, fields: dict[str, Any]) -> bool:
    """Whether ``path`` holds a finished run of this very setup and arm (so a rerun
    skips it; a run of another configuration left in the work folder is run again)."""
    if not path.exists():
        return False
    data = json.loads(path.read_text())
    return all(data.get(k) == v for k, v in run_identity(setup, fields).items())


def done(work: Path, job: Job, setup: Setup) -> bool:
    """``finished`` for ``job`` of this harness (its arm's record)."""
    return finished(work / f"{job.name}.json", setup, ARMS[job.arm].record)


def rank_main(args: argparse.Namespace) -> int:
    """One real TP rank under mpiexec (the check): the same training on a TPGroup."""
    from mpi4py import MPI  # noqa: PLC0415

    import coccl  # noqa: PLC0415
    from coccl.tensor_parallel import TPGroup  # noqa: PLC0415

    setup = Setup(**json.loads(args.setup))
    device = configure_torch(setup)
    arm, tp, seed = _parse_job(args.job)
    world = MPI.COMM_WORLD
    if world.Get_size() != tp:
        raise SystemExit(f"{args.job} needs mpiexec -n {tp}, not {world.Get_size()}")
    comm = coccl.init(world, backend=args.backend)
    a = ARMS[arm]
    group = TPGroup(comm, a.algorithm, a.compressor)
    quiet = world.Get_rank() != 0
    result = train(
        Job(arm, tp, seed),
        setup,
        group,
        device,
        None,
        lambda: False,
        (lambda msg: None) if quiet else (lambda msg: print(f"[real] {msg}", flush=True)),
        build=arm_build(a, functools.partial(TPGroup, comm, a.algorithm)),
    )
    backend = comm.backend
    comm.close()
    digests = world.allgather(result["replicated_sha256"])
    if world.Get_rank() == 0:
        identical = all(d == digests[0] for d in digests)
        write_json(args.out, {**result, "backend": backend, "replicated_identical": identical})
    return 0


# ----------------------------------------------------------------------------- runner
@contextlib.contextmanager
def mps_daemon(mode: str, log: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """An MPS control daemon for the workers (``mode``: auto, on, off), and what happened.

    The daemon lets the many small kernels of the runs sharing a GPU run side by side
    instead of time-slicing the GPU between processes. It is checked with one client
    before the workers start; in ``auto`` a daemon that cannot start or serve is left out
    (and said so); it is stopped on the way out."""
    info: dict[str, Any] = {"requested": mode, "used": False}
    exe = shutil.which("nvidia-cuda-mps-control")
    if mode == "off" or exe is None:
        info["reason"] = "off" if mode == "off" else "nvidia-cuda-mps-control not found"
        if mode == "on":
            raise RuntimeError(f"--mps on: {info['reason']}")
        yield info
        return
    folder = Path(tempfile.mkdtemp(prefix="coccl-mps-"))
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for path in env.values():
        Path(path).mkdir()
    full_env = {**os.environ, **env}
    started = subprocess.run([exe, "-d"], env=full_env, capture_output=True, text=True)
    probe = None
    if started.returncode == 0:
        code = "import torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()"
        probe = subprocess.run(
            [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120
        )
    if started.returncode != 0 or probe is None or probe.returncode != 0:
        reason = (started.stderr or (probe.stderr if probe else "") or "").strip()[-500:]
        info["reason"] = f"MPS did not start or serve: {reason}"
        subprocess.run([exe], input="quit\n", env=full_env, capture_output=True, text=True)
        if mode == "on":
            raise RuntimeError(info["reason"])
        log(f"[run] {info['reason']}; running without MPS")
        yield info
        return
    info.update(used=True, env=env)
    log(f"[run] MPS daemon started ({folder})")
    try:
        yield info
    finally:
        subprocess.run([exe], input="quit\n", env=full_env, capture_output=True, text=True)


def visible_gpus() -> list[str]:
    """The GPUs the workers may use (indices as CUDA_VISIBLE_DEVICES takes them)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [d.strip() for d in listed.split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


@dataclass
class Worker:
    """A worker process and the runs it was given."""

    jobs: list[Job]
    device: str
    proc: subprocess.Popen
    log: Path


def start_workers(
    jobs: list[Job],
    devices: list[str],
    per_device: int,
    setup: Setup,
    work: Path,
    env: dict,
    script: Path = SCRIPT,
    extra: tuple[str, ...] = (),
) -> list[Worker]:
    """Spread ``jobs`` (in their order) over ``per_device`` worker processes per device,
    round robin, and start them (``script``'s ``worker`` command, with ``extra``
    arguments)."""
    slots = len(devices) * per_device
    workers = []
    for i in range(min(slots, len(jobs))):
        mine = jobs[i::slots]
        device = devices[i % len(devices)]
        worker_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        if device != "cpu":
            worker_env["CUDA_VISIBLE_DEVICES"] = device
        log = work / f"worker-{i}.log"
        cmd = [
            sys.executable,
            str(script),
            "worker",
            *extra,
            "--jobs",
            ",".join(j.name for j in mine),
            "--setup",
            json.dumps(asdict(setup)),
            "--work-dir",
            str(work),
        ]
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=worker_env, stdout=fh, stderr=subprocess.STDOUT
            )
        workers.append(Worker(mine, device, proc, log))
    return workers


def projected_s(worker: Worker, setup: Setup, is_done: Callable[[Job], bool]) -> float | None:
    """Seconds a running worker still needs, from the rate in its log's last line."""
    lines = [ln for ln in worker.log.read_text().splitlines() if ln.endswith("steps/s")]
    if not lines:
        return None
    _, rest = lines[-1][1:].split("]", 1)
    step, rate = int(rest.split()[1]), float(rest.split()[-2])
    left = sum(not is_done(j) for j in worker.jobs) - 1
    return ((setup.steps - step) + max(0, left) * setup.steps) / max(rate, 1e-9)


def wait_for(
    workers: list[Worker],
    work: Path,
    setup: Setup,
    deadline: float,
    log: Any,
    progress: Callable[[], None] | None = None,
    is_done: Callable[[Job], bool] | None = None,
) -> bool:
    """Wait for the workers, reporting progress and a projection every 30 s (and calling
    ``progress``, e.g. to write the partial results); at ``deadline`` ask them to stop at
    a checkpoint. ``is_done``: whether a job's run is finished (default: this harness's
    ``done``). Returns whether every worker finished."""
    if is_done is None:
        is_done = functools.partial(done, work, setup=setup)
    began, last_report = time.perf_counter(), 0.0
    stopped, kill_at = False, math.inf
    while any(w.proc.poll() is None for w in workers):
        time.sleep(1.0)
        now = time.perf_counter()
        if now - last_report >= 30:
            last_report = now
            finished_runs = sum(is_done(j) for w in workers for j in w.jobs)
            total = sum(len(w.jobs) for w in workers)
            running = [w for w in workers if w.proc.poll() is None]
            left = [p for p in (projected_s(w, setup, is_done) for w in running) if p is not None]
            eta = f", about {max(left):.0f} s to go" if left else ""
            log(
                f"[run] {now - began:5.0f} s: {finished_runs}/{total} runs done, "
                f"{len(running)} workers running{eta}"
            )
            if progress is not None:
                progress()
        if not stopped and now >= deadline:
            stopped = True
            log("[run] time limit: asking the workers to stop at a checkpoint")
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
            kill_at = now + 90
        if stopped and now >= kill_at:
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.kill()
    return all(w.proc.returncode == 0 for w in workers)


def run_main(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(msg, flush=True)

    began = time.perf_counter()
    setup = SMOKE if args.smoke else replace(FULL, steps=args.steps, cuda_graph=args.cuda_graph)
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    tps = [int(t) for t in args.tps.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = experiment_jobs(arms, tps, seeds, parse_only(args.only))
    devices = (
        ["cpu"]
        if setup.device == "cpu"
        else (args.gpus.split(",") if args.gpus else visible_gpus())
    )
    if not devices:
        raise SystemExit("no GPU found (nvidia-smi -L); use --smoke for a CPU run")
    per_device = args.jobs_per_gpu or -(-len(jobs) // len(devices))
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    todo = [j for j in jobs if not done(work, j, setup)]
    log(
        f"[run] {len(jobs)} runs ({len(jobs) - len(todo)} already in {work}), "
        f"{len(devices)} device(s) x {per_device} workers; setup {asdict(setup)}"
    )
    mps_mode = "off" if setup.device == "cpu" else args.mps
    workers: list[Worker] = []
    complete = True
    with mps_daemon(mps_mode, log) as mps:
        if todo:
            workers = start_workers(todo, devices, per_device, setup, work, mps.get("env", {}))
            complete = wait_for(workers, work, setup, began + args.time_limit_s, log)
    failed = [w for w in workers if w.proc.returncode not in (0, INTERRUPTED)]
    for w in failed:
        log(f"[run] worker on {w.device} failed (exit {w.proc.returncode}); its log:")
        log(w.log.read_text()[-4000:])
    results = [
        json.loads((work / f"{j.name}.json").read_text()) for j in jobs if done(work, j, setup)
    ]
    missing = [j.name for j in jobs if not done(work, j, setup)]
    report = build_report(results, setup, arms, tps, seeds, mps, argv=args.argv)
    report["incomplete"] = missing
    report["wall_s"] = time.perf_counter() - began
    out: Path = args.out
    if out.exists():  # keep the check's section when the experiment is rewritten
        previous = json.loads(out.read_text())
        if "real_vs_sim" in previous:
            report["real_vs_sim"] = previous["real_vs_sim"]
    png = args.png or out.with_suffix(".png")
    frontier = args.command == "frontier"
    if frontier:
        report["frontier"] = tp_frontier.frontier(report, TARGET_DELTA_PCT, TARGET_CI_BELOW_PCT)
        report["frontier_fewest_bytes"] = tp_frontier.fewest_bytes(report["frontier"])
        report["frontier_rule"] = (
            f"meets_target: delta <= +{TARGET_DELTA_PCT}% vs uncompressed and its 95% "
            f"interval's upper end below +{TARGET_CI_BELOW_PCT}%; bytes_per_element: the "
            "codec's payload bytes of one TP AllReduce (batch x seq x d_model elements) "
            "per element, forward bfloat16, backward float32, mean of the two (a step "
            "has as many elements of each)"
        )
    write_json(out, report)
    if results:
        # the frontier's PNG is its bytes against loss; its loss curves go beside it
        plot(report, png.with_name(png.stem + "-curves.png") if frontier else png)
        if frontier:
            tp_frontier.plot_frontier(report, png, TARGET_DELTA_PCT, TARGET_CI_BELOW_PCT)
    print_summary(report, log)
    if frontier:
        tp_frontier.print_frontier(report, log)
    if missing:
        log(f"[run] {len(missing)} runs not finished: run the same command again to resume")
        return 3
    return 0 if complete and not failed else 1


# ---------------------------------------------------------------------------- report
def build_report(
    results: list[dict[str, Any]],
    setup: Setup,
    arms: list[str],
    tps: list[int],
    seeds: list[int],
    mps: dict[str, Any],
    argv: list[str],
) -> dict[str, Any]:
    """The JSON: runs, per-arm summary with paired deltas, target, provenance."""
    rows = [
        {k: v for k, v in r.items() if k not in ("train_losses", "setup", "corpus")}
        for r in results
    ]
    finals: dict[tuple[str, int], dict[int, float]] = {}
    for r in results:
        if _finite(r["val_loss"]):
            finals.setdefault((r["arm"], r["tp"]), {})[r["seed"]] = r["val_loss"]
    reference = finals.get(("uncompressed", 1), {})
    summary: dict[str, Any] = {}
    for arm in arms:
        for tp in [1] if ARMS[arm].compressor is None else tps:
            mine = finals.get((arm, tp), {})
            ran = [r for r in results if r["arm"] == arm and r["tp"] == tp]
            mean, sd = stats.mean_sd(list(mine.values()))
            vs_unc = stats.paired_delta_pct(mine, reference)
            vs_id = stats.paired_delta_pct(mine, finals.get(("identity", tp), {}))
            unpaired = stats.welch_delta_pct(list(mine.values()), list(reference.values()))
            summary.setdefault(arm, {})[f"tp{tp}"] = {
                "n": len(mine),
                "diverged": len(ran) - len(mine),
                "mean": mean,
                "sd": sd,
                "delta_pct_vs_uncompressed": vs_unc["delta_pct"],
                "delta_pct_vs_uncompressed_ci": vs_unc["ci"],
                "delta_pct_vs_identity": vs_id["delta_pct"] if arm != "uncompressed" else None,
                "delta_pct_vs_identity_ci": vs_id["ci"] if arm != "uncompressed" else None,
                "delta_pct_vs_uncompressed_unpaired": unpaired["delta_pct"],
                "delta_pct_vs_uncompressed_unpaired_ci": unpaired["ci"],
                "val_loss_by_seed": {str(s): v for s, v in sorted(mine.items())},
            }
    # Each arm's entry also carries, at its top level, the fields of its smallest TP size
    # that ran (``tp`` says which), so a reader keyed by arm alone finds n, mean, sd and
    # the deltas; every TP size's are under ``tp<N>``.
    for entries in summary.values():
        ran = [(int(k[2:]), v) for k, v in entries.items() if v["n"]]
        if ran:
            tp, first_entry = min(ran, key=lambda item: item[0])
            entries.update({"tp": tp, **first_entry})
    target = {}
    for tp in tps:
        taco = summary.get("taco", {}).get(f"tp{tp}")
        if taco is not None:
            delta, ci = taco["delta_pct_vs_uncompressed"], taco["delta_pct_vs_uncompressed_ci"]
            target[f"tp{tp}"] = {
                "delta_pct": delta,
                "ci": ci,
                "met": bool(
                    _finite(delta)
                    and _finite(ci[1])
                    and delta <= TARGET_DELTA_PCT
                    and ci[1] < TARGET_CI_BELOW_PCT
                ),
            }
    first = results[0] if results else {}
    return {
        "what": (
            "final validation loss of a byte-level GPT trained with virtual TP ranks "
            "(coccl.tensor_parallel.VirtualTPGroup: bitwise a real coccl TP run) against "
            "the plain model, per wire codec, schedule and TP size"
        ),
        **provenance("examples/tp_convergence_gpu.py", argv, results),
        "setup": asdict(setup),
        "model": {
            "layers": setup.layers,
            "d_model": setup.d_model,
            "heads": setup.heads,
            "seq": setup.seq,
            "params": first.get("params"),
            "autocast": "bfloat16",
        },
        "corpus": first.get("corpus"),
        "arms": {a: ARMS[a].record for a in arms},
        "tps": tps,
        "seeds": seeds,
        "mps": mps,
        "cuda_graph_runs": sum(bool(r.get("cuda_graph")) for r in results),
        "runs": rows,
        "summary": summary,
        "summary_layout": (
            "summary[arm]['tp<N>'] per TP size (the plain model: 'tp1'); the top level of "
            "summary[arm] repeats the smallest TP size's fields, 'tp' naming it"
        ),
        "interval": (
            "delta_pct_* = mean over seeds of 100 (L_arm,s / L_ref,s - 1), paired by seed "
            "(arms of a seed share initial weights and data order); *_ci = Student t 95% "
            "interval of those paired differences (n - 1 degrees of freedom). The "
            "*_unpaired_ci (Welch, difference of means) is given for comparison."
        ),
        "target": {
            "rule": f"taco (two_shot) delta <= +{TARGET_DELTA_PCT}% vs uncompressed, "
            f"95% interval below +{TARGET_CI_BELOW_PCT}%",
            **target,
        },
    }


def provenance(script: str, argv: list[str], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a report comes from: the command, date, commit, codec sources, GPUs and
    versions of its runs."""
    commit, dirty = git_commit()
    return {
        "command": shlex.join(["python", script, *argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "worktree_dirty": dirty,
        "compressors_sha256": codec_sources_digest(),
        "gpu": sorted({r["device"] for r in results}),
        "versions": results[0].get("versions") if results else None,
    }


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _jsonable(obj: Any) -> Any:
    """NaN and infinities as null (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def per_tp(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """An arm's summary entries per TP size: ``[("tp4", {...}), ...]``."""
    return [(k, v) for k, v in entry.items() if k.startswith("tp") and isinstance(v, dict)]


def print_summary(report: dict[str, Any], log: Callable[[str], None]) -> None:
    head = f"{'val loss':>17}{'vs uncompressed %':>28}{'vs identity %':>26}"
    log(f"\n{'arm':<20}{'TP':>4}{'n':>3}{head}")
    for arm, entry in report["summary"].items():
        for tp, s in per_tp(entry):
            unc = _fmt_delta(s["delta_pct_vs_uncompressed"], s["delta_pct_vs_uncompressed_ci"])
            ident = _fmt_delta(s["delta_pct_vs_identity"], s["delta_pct_vs_identity_ci"])
            loss = f"{_fmt(s['mean'], '.4f')} +- {_fmt(s['sd'], '.4f')}"
            log(f"{arm:<20}{tp[2:]:>4}{s['n']:>3}{loss:>17}{unc:>28}{ident:>26}")
    for tp, t in report["target"].items():
        if isinstance(t, dict):
            verdict = "met" if t["met"] else "NOT met"
            log(f"target at {tp}: {verdict} ({_fmt_delta(t['delta_pct'], t['ci'])})")


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if _finite(v) else "-"


def _fmt_delta(delta: Any, ci: Any) -> str:
    if delta is None:
        return "-"
    return f"{_fmt(delta, '+.3f')} [{_fmt(ci[0], '+.3f')}, {_fmt(ci[1], '+.3f')}]"


def _seeds_per_arm(runs: list[dict[str, Any]]) -> str:
    """How many finished seeds each arm has, as a label: ``27``, or ``5-7`` where they differ
    (a table cut off at its time limit counts its finished runs, not the requested seeds)."""
    per_arm: dict[Any, int] = {}
    for r in runs:
        per_arm[r["arm"], r["tp"]] = per_arm.get((r["arm"], r["tp"]), 0) + 1
    low, high = min(per_arm.values(), default=0), max(per_arm.values(), default=0)
    return str(low) if low == high else f"{low}-{high}"


def plot(
    report: dict[str, Any],
    path: Path,
    *,
    reference_tp: int = 1,
    panel: str = "TP = {tp} (virtual ranks)",
    title: str = "coccl TP convergence",
) -> None:
    """Validation loss against steps (mean over seeds) per arm, one panel per TP size,
    and below it each arm's paired gap to the reference arm ``uncompressed`` (its runs at
    ``reference_tp``), in percent; ``panel`` and ``title`` name the panels and figure."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs = report["runs"]
    tps = report["tps"]

    def curves(arm: str, tp: int) -> dict[int, dict[int, float]]:
        """seed -> step -> val loss"""
        return {
            r["seed"]: {h["step"]: h["val_loss"] for h in r["history"] if _finite(h["val_loss"])}
            for r in runs
            if r["arm"] == arm and r["tp"] == tp
        }

    base = curves("uncompressed", reference_tp)
    fig, axes = plt.subplots(2, len(tps), figsize=(7 * len(tps), 9), squeeze=False)
    for col, tp in enumerate(tps):
        ax, gap = axes[0][col], axes[1][col]
        shown: list[float] = []  # the curves past their first point, for the y range
        for arm in report["arms"]:
            c = base if arm == "uncompressed" else curves(arm, tp)
            if not c:
                continue
            steps = sorted(set.intersection(*(set(v) for v in c.values())))
            mean = [sum(v[s] for v in c.values()) / len(c) for s in steps]
            shown += mean[1:] or mean
            width = 2.2 if arm in ("uncompressed", "taco") else 1.2
            color = "k" if arm == "uncompressed" else None
            line = ax.plot(steps, mean, label=arm, lw=width, color=color)[0]
            paired = [seed for seed in c if seed in base]
            if arm == "uncompressed" or not paired:
                continue
            both = [s for s in steps if all(s in base[seed] for seed in paired)]
            gaps = [
                sum(100 * (c[seed][s] / base[seed][s] - 1) for seed in paired) / len(paired)
                for s in both
            ]
            gap.plot(both, gaps, color=line.get_color(), lw=width, label=arm)
        if shown:
            low, high = min(shown), max(shown)
            ax.set_ylim(low - 0.05 * (high - low + 1e-3), high + 0.05 * (high - low + 1e-3))
        m = report["model"]
        params = (m["params"] or 0) / 1e6
        ax.set(
            xlabel="step",
            ylabel="validation loss (nats/byte, mean over seeds)",
            title=f"{panel.format(tp=tp)}: {params:.1f} M params, {m['layers']} layers, "
            f"d = {m['d_model']}",
        )
        gap.axhline(0.0, color="k", lw=1)
        gap.axhline(TARGET_DELTA_PCT, color="grey", ls=":", lw=1, label=f"+{TARGET_DELTA_PCT}%")
        gap.set(xlabel="step", ylabel="val loss vs uncompressed (%, paired by seed)")
        low, high = gap.get_ylim()
        gap.set_ylim(max(low, -5.0), min(high, 10.0))
        for a in (ax, gap):
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
    gpus = ", ".join(report["gpu"]) or "?"
    fig.suptitle(f"{title}, {_seeds_per_arm(report['runs'])} seeds per arm ({gpus})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ check
def check_main(args: argparse.Namespace) -> int:
    """A real TP run under mpiexec against the simulated run of the same arm, seed and
    steps: every step's training loss, the evaluations and the final loss compared."""
    setup = SMOKE if args.smoke else replace(FULL, steps=args.steps)
    setup = replace(setup, cuda_graph="off", deterministic=setup.device == "cuda")
    backend = "mpi" if setup.device == "cpu" else args.backend
    job = Job(args.arm, args.tp, args.seed)
    if ARMS[job.arm].compressor is None:
        raise SystemExit("the check needs a TP arm")
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    real_out, sim_dir = work / "real.json", work / "sim"
    sim_dir.mkdir(exist_ok=True)
    (sim_dir / f"{job.name}.json").unlink(missing_ok=True)
    (sim_dir / f"{job.name}.ckpt").unlink(missing_ok=True)
    setup_json = json.dumps(asdict(setup))
    real_cmd = [
        *mpiexec(), "-n", str(job.tp), sys.executable, "-m", "mpi4py", str(SCRIPT), "rank",
        "--job", job.name, "--setup", setup_json, "--backend", backend, "--out", str(real_out),
    ]  # fmt: skip
    sim_cmd = [
        sys.executable, str(SCRIPT), "worker", "--jobs", job.name, "--setup", setup_json,
        "--work-dir", str(sim_dir),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    sim_env = {**env, "CUDA_VISIBLE_DEVICES": args.sim_gpu} if setup.device == "cuda" else env
    began = time.perf_counter()
    print(
        f"[check] real: {shlex.join(real_cmd)}\n[check] simulated: {shlex.join(sim_cmd)}",
        flush=True,
    )
    real = subprocess.Popen(real_cmd, cwd=ROOT, env=env)
    sim = subprocess.Popen(sim_cmd, cwd=ROOT, env=sim_env)
    codes = real.wait(), sim.wait()
    if codes != (0, 0):
        print(f"[check] failed: exit codes real {codes[0]}, simulated {codes[1]}", flush=True)
        return 1
    real_res = json.loads(real_out.read_text())
    sim_res = json.loads((sim_dir / f"{job.name}.json").read_text())
    section = {
        **compare_runs(real_res, sim_res),
        "arm": job.arm,
        "tp": job.tp,
        "seed": job.seed,
        "steps": setup.steps,
        "backend": real_res["backend"],
        "device": real_res["device"],
        "setup": asdict(setup),
        "command": shlex.join(["python", "examples/tp_convergence_gpu.py", *args.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit()[0],
        "wall_s": time.perf_counter() - began,
    }
    out: Path = args.out
    report = json.loads(out.read_text()) if out.exists() else {}
    report["real_vs_sim"] = section
    write_json(out, report)
    verdict = "bitwise identical" if section["bitwise_equal"] else "DIFFERENT"
    print(
        f"[check] {job.name} real ({section['backend']}) vs simulated over {setup.steps} steps: "
        f"{verdict}; first differing step {section['first_differing_step']}, max |delta| of "
        f"the training loss {section['max_abs_diff_train_loss']:.3g}, final val "
        f"{section['val_loss_real']:.6f} / {section['val_loss_sim']:.6f}; wrote {out}",
        flush=True,
    )
    return 0


def compare_runs(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Step-by-step agreement of two runs' losses."""
    a, b = real["train_losses"], sim["train_losses"]
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    first = next((i + 1 for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    val_a = [h["val_loss"] for h in real["history"]]
    val_b = [h["val_loss"] for h in sim["history"]]
    return {
        "bitwise_equal": first is None and val_a == val_b and real["val_loss"] == sim["val_loss"],
        "first_differing_step": first,
        "max_abs_diff_train_loss": max(diffs, default=0.0),
        "max_rel_diff_train_loss": max(
            (d / abs(x) for d, x in zip(diffs, a, strict=True) if x), default=0.0
        ),
        "max_abs_diff_val_loss": max(
            (abs(x - y) for x, y in zip(val_a, val_b, strict=True)), default=0.0
        ),
        "val_loss_real": real["val_loss"],
        "val_loss_sim": sim["val_loss"],
        "history_real": real["history"],
        "history_sim": sim["history"],
    }


# ---------------------------------------------------------------------------- estimate
def estimate_main(args: argparse.Namespace) -> int:
    """Print the work of one training step per TP size (see the module docstring)."""
    s = SMOKE if args.smoke else FULL
    d, L, tokens = s.d_model, s.layers, s.batch * s.seq
    blocks = L * (12 * d * d + 13 * d)
    params = blocks + 256 * d * 2 + s.seq * d + 2 * d
    count = tokens * d
    print(f"params {params / 1e6:.2f} M, {tokens} tokens per step, {s.steps} steps")
    print(f"matmul FLOPs per step: {6 * params * tokens / 1e12:.3f} TFLOP (any TP)")
    print(f"AllReduces per step: {4 * L} of {count / 1e6:.2f} M elements (+{2 * L} per eval batch)")
    for n in (4, 8):
        two_shot, ring = 2 * n + 4, 3 * n + 2
        moved = 25 * n * count * 4 * L / 1e9
        print(
            f"TP={n}: array operations per AllReduce two_shot {two_shot}, ring {ring}; "
            f"~{moved:.1f} GB moved per step by the simulation"
        )
    return 0


# -------------------------------------------------------------------------------- CLI
def add_runner_options(
    run: argparse.ArgumentParser, jobs_per_gpu: int, time_limit_s: float, work_dir: Path
) -> None:
    """The runner's options (GPUs, workers, MPS, CUDA graphs, time limit, work folder),
    with these defaults: every harness built on this runner takes them."""
    run.add_argument("--gpus", default="", help="GPU indices to use (empty: all visible)")
    run.add_argument(
        "--jobs-per-gpu",
        type=int,
        default=jobs_per_gpu,
        help="worker processes per GPU (0: all runs at once)",
    )
    run.add_argument("--mps", choices=["auto", "on", "off"], default="auto", help="CUDA MPS daemon")
    run.add_argument(
        "--cuda-graph", choices=["auto", "on", "off"], default="auto", help="capture the step"
    )
    run.add_argument(
        "--time-limit-s",
        type=float,
        default=time_limit_s,
        help="stop (with checkpoints) after this",
    )
    run.add_argument(
        "--work-dir",
        type=Path,
        default=work_dir,
        help="per-run results and checkpoints (a rerun resumes from them)",
    )


def add_experiment_options(
    run: argparse.ArgumentParser,
    arms: list[str],
    seeds: str,
    only: str,
    out: Path,
    jobs_per_gpu: int,
) -> None:
    """``run``'s and ``frontier``'s options, with these defaults."""
    run.add_argument("--smoke", action="store_true", help="tiny model, 4 steps, on the CPU")
    run.add_argument("--arms", default=",".join(arms), help="comma-separated arms")
    run.add_argument("--tps", default="4,8", help="TP sizes of the TP arms")
    run.add_argument("--seeds", default=seeds, help="seeds (weights and data order)")
    run.add_argument(
        "--only", default=only, help="TP=arm+arm,...: at that TP size run only those arms"
    )
    run.add_argument("--steps", type=int, default=FULL.steps, help="training steps")
    work = Path(tempfile.gettempdir()) / f"coccl-{out.stem}"
    add_runner_options(run, jobs_per_gpu, 480.0, work)
    run.add_argument("--out", type=Path, default=out, help="the JSON")
    run.add_argument("--png", type=Path, default=None, help="the plot (None: beside --out)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="the experiment (phase 1)", formatter_class=fmt)
    add_experiment_options(run, DEFAULT_ARMS, "0,1,2", "", DEFAULT_OUT, 0)
    frontier = sub.add_parser(
        "frontier", help="the 4-6-bit codecs' bytes against loss (#33)", formatter_class=fmt
    )
    add_experiment_options(frontier, FRONTIER_ARMS, "0,1,2,3,4", "8=taco", DEFAULT_FRONTIER_OUT, 10)

    check = sub.add_parser(
        "check", help="real TP over NCCL vs simulated (phase 2)", formatter_class=fmt
    )
    check.add_argument("--smoke", action="store_true", help="tiny model on CPU ranks over MPI")
    check.add_argument("--arm", default="taco", choices=[a for a in ARMS if ARMS[a].compressor])
    check.add_argument("--tp", type=int, default=2, help="ranks (one GPU each)")
    check.add_argument("--seed", type=int, default=0, help="seed")
    check.add_argument("--steps", type=int, default=FULL.steps, help="training steps")
    check.add_argument("--backend", default="nccl", help="coccl backend of the real ranks")
    check.add_argument("--sim-gpu", default="0", help="GPU of the simulated run")
    check.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "coccl-tp-check",
        help="scratch folder",
    )
    check.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON to add real_vs_sim to")

    est = sub.add_parser("estimate", help="print the work per step", formatter_class=fmt)
    est.add_argument("--smoke", action="store_true", help="of the smoke setup")

    worker = sub.add_parser("worker", help="(internal) runs on virtual ranks", formatter_class=fmt)
    worker.add_argument("--jobs", required=True, help="comma-separated run names")
    worker.add_argument("--setup", required=True, help="the Setup as JSON")
    worker.add_argument("--work-dir", type=Path, required=True, help="results and checkpoints")

    rank = sub.add_parser("rank", help="(internal) one real TP rank", formatter_class=fmt)
    rank.add_argument("--job", required=True, help="the run name")
    rank.add_argument("--setup", required=True, help="the Setup as JSON")
    rank.add_argument("--backend", default="nccl", help="coccl backend")
    rank.add_argument("--out", type=Path, required=True, help="rank 0's result JSON")

    args = p.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    commands = {
        "run": run_main,
        "frontier": run_main,
        "check": check_main,
        "estimate": estimate_main,
        "worker": worker_main,
        "rank": rank_main,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
