"""Write the runs of an earlier tp_convergence_gpu.py report into its work directory, so
that ``run`` (or ``frontier``) skips them (a run is finished when its file holds the same
setup and the same arm fields: ``tp_convergence_gpu.finished``). Each written run names
the report it came from (``from_report``: its path, commit and codec sources' digest),
which the new report's rows keep. ``--except NAME,...`` leaves those runs out, so they
run again: a reproduction check of the earlier runs.

    python bench/scripts/prepopulate_runs.py REPORT.json WORK_DIR [--except NAME,...]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tp_convergence_gpu import Job  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("report", type=Path)
parser.add_argument("work", type=Path)
parser.add_argument("--except", dest="skip", default="", help="run names to leave out")
args = parser.parse_args()
report = json.loads(args.report.read_text())
origin = {
    "path": str(args.report),
    "commit": report.get("commit"),
    "compressors_sha256": report.get("compressors_sha256"),
}
skip = set(filter(None, args.skip.split(",")))
args.work.mkdir(parents=True, exist_ok=True)
written = 0
for run in report["runs"]:
    name = Job(run["arm"], run["tp"], run["seed"]).name
    if name in skip:
        continue
    row = {**run, "setup": report["setup"], "corpus": report.get("corpus")}
    row.setdefault("from_report", origin)
    (args.work / f"{name}.json").write_text(json.dumps(row))
    written += 1
print(f"{written} runs written to {args.work} ({len(skip)} left out to run again)")
