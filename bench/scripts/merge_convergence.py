"""Merge several reports of ``examples/tp_convergence_gpu.py run`` (made by separate
invocations, e.g. one device call each) into one: the union of their runs, the summary
and plot rebuilt from it, the real-vs-simulated check and each part's command kept.

    python bench/scripts/merge_convergence.py OUT.json PART.json [PART.json ...]
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import tp_convergence_gpu as tpc  # noqa: E402

out = Path(sys.argv[1])
parts = [json.loads(Path(p).read_text()) for p in sys.argv[2:]]
runs: dict[tuple[str, int, int], dict] = {}
for part in parts:
    if part["setup"] != parts[0]["setup"]:
        raise SystemExit("the parts ran different setups")
    for run in part["runs"]:
        runs[(run["arm"], run["tp"], run["seed"])] = run
results = [runs[k] for k in sorted(runs)]
arms = [a for a in tpc.ARMS if any(r["arm"] == a for r in results)]
tps = sorted({r["tp"] for r in results if r["tp"] > 1})
seeds = sorted({r["seed"] for r in results})
setup = tpc.Setup(**parts[0]["setup"])
report = tpc.build_report(results, setup, arms, tps, seeds, parts[-1]["mps"], argv=["merge"])
report["parts"] = [
    {"command": p["command"], "date": p["date"], "runs": len(p["runs"])} for p in parts
]
report["command"] = "; ".join(p["command"] for p in parts)
report["incomplete"] = []
for part in parts:
    if "real_vs_sim" in part:
        report["real_vs_sim"] = part["real_vs_sim"]
out.write_text(json.dumps(report, indent=1) + "\n")
tpc.plot(report, out.with_suffix(".png"))
tpc.print_summary(report, print)
