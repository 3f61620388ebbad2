"""Write the runs of an earlier tp_convergence_gpu.py report into its work directory, so
that ``run`` skips them (a run is finished when its file holds the same setup).

    python bench/scripts/prepopulate_runs.py REPORT.json WORK_DIR
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tp_convergence_gpu import Job  # noqa: E402

report = json.loads(Path(sys.argv[1]).read_text())
work = Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)
for run in report["runs"]:
    name = Job(run["arm"], run["tp"], run["seed"]).name
    (work / f"{name}.json").write_text(json.dumps({**run, "setup": report["setup"]}))
print(f"{len(report['runs'])} runs written to {work}")
