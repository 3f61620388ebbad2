"""Collect the two-H200 NCCL measurements into bench/results/h200x2-nccl-links.json: the
coccl-bench AllReduce sweeps on each link class (rows with a ``link`` field; ``speedup`` is
NCCL's own AllReduce time over the row's, in the same run) and the per-call costs of
bench/scripts/percall.py. A sweep that its time limit stopped before it wrote its JSON is
read from the table it printed (``source``: "table"), which holds every finished size.

Raw sweeps are named ``links-LINK-DTYPE[-TAG].txt`` (and ``.json``); where several measured
the same row (link, dtype, size, algorithm, compressor), the latest in ``ORDER`` is kept,
and ``sweep`` names it. A row whose replay-or-eager path (its ``ran.graph``) differs from
what coccl/sizing.py now chooses is marked ``path_now``; an ``auto`` row that ran another
schedule than auto now picks, ``auto_now``. The A/B sweeps of two-shot's AllGather phase
(``gather-[hop-]LINK-{p2p,allgather}.json``: COCCL_NCCL_GATHER set each way) go to
``gather_ab``.

    python bench/scripts/merge_links.py OUT.json RAW_DIR
"""

import json
import sys
from pathlib import Path

from coccl import get_compressor
from coccl.algorithms import choose
from coccl.communicator.sizing import replays

out, raw = Path(sys.argv[1]), Path(sys.argv[2])
LINKS = {"nvlink": "nvlink", "shm": "shm", "socket": "socket"}
# sweep tags, oldest first
ORDER = ["", "s9", "s9order", "s9replay", "s10", "s10b", "s10d", "s10e"]
ORDER += ["s11", "s11b", "s11c", "s11d"]


def table_rows(path: Path) -> tuple[str, list[dict]]:
    """The command and the rows of a printed coccl-bench table (2 ranks: busbw = algbw)."""
    command, rows = "", []
    for line in path.read_text().splitlines():
        if line.startswith("# command:"):
            command = line.removeprefix("# command:").strip()
        if line.startswith("#") or not line.strip() or not line.split()[0].isdigit():
            continue
        f = line.split()
        if len(f) not in (13, 14):
            continue
        asked, _, ran = f[4].partition(">")
        wide = len(f) == 14
        rows.append({
            "size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3],
            "algorithm": asked, "ran_algorithm": ran or asked, "compressor": f[5],
            "time_us": float(f[6]), "busbw": float(f[7]),
            "time_us_inplace": float(f[8]),
            "ratio": float(f[10 if wide else 9]), "rel_err": float(f[11 if wide else 10]),
            "wrong": int(f[12 if wide else 11]), "speedup": float(f[13 if wide else 12]),
            "source": "table",
        })  # fmt: skip
    return command, rows


def sweep_order(txt: Path) -> int:
    return ORDER.index((txt.stem.split("-") + [""])[3])


sweeps, latest = [], {}
for txt in sorted(raw.glob("links-*.txt"), key=sweep_order):
    name = txt.stem.removeprefix("links-")
    link, dtype, *_ = name.split("-")
    js = txt.with_suffix(".json")
    if js.exists():
        record = json.loads(js.read_text())
        command, found = record["command"], record["rows"]
        for r in found:
            r["source"] = "json"
    else:
        command, found = table_rows(txt)
    for r in found:
        r["link"] = LINKS[link]
        r["sweep"] = name
        ran = r.get("ran")
        if ran and ran["algorithm"] != "native":
            now = replays(link, r["size"], follows=ran["compressor"]["id"] != "identity")
            if ran["graph"] != now:
                r["path_now"] = "replayed" if now else "eager"
        if ran and r["algorithm"] == "auto":
            codec = get_compressor(ran["compressor"])
            picked = choose("allreduce", r["size"], codec, "nccl", link, 2).algorithm
            if picked != ran["algorithm"]:
                r["auto_now"] = picked
        latest[(link, r["type"], r["size"], r["algorithm"], r["compressor"])] = r
    sweeps.append({"sweep": name, "link": link, "dtype": dtype, "command": command,
                   "rows": len(found), "source": "json" if js.exists() else "table"})  # fmt: skip
rows = sorted(latest.values(), key=lambda r: (r["link"], r["type"], r["size"]))
per_call = []
for js in sorted(raw.glob("percall-*.json")):
    record = json.loads(js.read_text())
    for r in record["rows"]:
        per_call.append({**r, "link": record["link"], "dtype": record["dtype"]})
    sweeps.append({"per_call": True, "link": record["link"], "command": record["command"]})
gather_ab = []
for js in sorted(raw.glob("gather-*.json")):
    record = json.loads(js.read_text())
    *_, link, gather = js.stem.split("-")
    gather_ab.append({
        "sweep": js.stem, "link": link, "allgather_phase": gather,
        "reduction": "fused hop" if "-hop-" in js.stem else "float32 accumulator",
        "command": record["command"],
        "rows": [{k: r[k] for k in ("size", "type", "time_us", "time_us_inplace", "speedup")}
                 for r in record["rows"]],
    })  # fmt: skip
result = {
    "what": "AllReduce on 2 H200s (one rank per GPU, NCCL 2.28): coccl's schedules against "
    "NCCL's own AllReduce per link class; per-call cost against torch.distributed and raw NCCL",
    "gpu": "2x NVIDIA H200 (NV18)",
    "date": "2026-11-30",
    "commits": {
        "sweeps": "untagged sweeps: a2c35c1; s9, s9order: 8abc8bd with REPLAY_MAX_BYTES then "
        "64 MiB on NVLink and 16 MiB elsewhere; s9replay: 8abc8bd; s10: 3860d33 before its "
        "rebasing's host cost was trimmed; s10b: 3860d33; s10d: e8bcaac; s10e: 69741f3; "
        "s11: 24a85af (the hop writes its decoded chunk); s11b: 5f43ead (the EPL hop at "
        "every size); s11c: cce8bba (two-shot's ReduceScatter exchange through "
        "ncclAllGather on 2 ranks; EPL hop at every size); s11d: 2682bfc (the EPL hop from "
        "64M elements)",
        "gather_ab": "gather-LINK-*: 3860d33; gather-hop-shm-*: e8bcaac",
        "per_call": "2682bfc",
        "note": "the device machine's copy reported an older commit in each raw file; these "
        "are the trees that ran",
    },
    "environment": "NCCL_NVLS_ENABLE=0; shm: NCCL_P2P_DISABLE=1; socket: NCCL_P2P_DISABLE=1 "
    "NCCL_SHM_DISABLE=1 (loopback sockets)",
    "commands": sweeps,
    "rows": rows,
    "per_call": per_call,
    "gather_ab": gather_ab,
}
out.write_text(json.dumps(result, indent=1) + "\n")
print(f"{len(rows)} sweep rows, {len(per_call)} per-call rows -> {out}")
