"""Run the multi-rank test files of tests/mpi/ on 1, 2, 3 and 4 ranks, one case each.

The CPU files selected for one rank count share one launch (a launch costs each rank
seconds of start-up: Python, MPI, pytest, coccl, the cached kernels); each file's case
then passes or fails on its own, from every rank's JUnit report of that launch. A launch
that fails where no report names a failing test (a crash, a hang, an abort at exit) fails
every case of it. Each file still gets a communicator of its own (``comm`` is
module-scoped). The GPU files launch one at a time, as they always did.

Files named in SLOW carry the ``slow`` marker (``pytest -m "not slow"`` leaves them out).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu import GPU
from mpi_launch import run_ranks

SLOW = {"test_soak.py"}
FILES = [
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
    for name in sorted(p.name for p in (Path(__file__).parent / "mpi").glob("test_*.py"))
]
SHARED_TIMEOUT_S = 1800  # every CPU file in one launch (about 4 minutes on 4 ranks, 2 cores)


def failures(logdir: Path, nranks: int) -> dict[str, list[str]] | None:
    """Each file's failed cases, from every rank's JUnit report (None: a report is missing
    or unreadable, as after a crash or a hang)."""
    found: dict[str, list[str]] = {}
    for rank in range(nranks):
        try:
            root = ET.parse(logdir / f"rank-{rank}.xml").getroot()
        except (OSError, ET.ParseError):
            return None
        for case in root.iter("testcase"):
            # "tests.mpi.test_x" (a collection error: no classname, that in the name)
            address = f"{case.get('classname', '')}.{case.get('name', '')}".split(".")
            name = next((part + ".py" for part in address if part.startswith("test_")), "")
            found.setdefault(name, [])
            for bad in [*case.iter("failure"), *case.iter("error")]:
                message = (bad.get("message") or "").splitlines()[:1]
                found[name].append(f"rank {rank}: {case.get('name')}: {' '.join(message)}")
    return found


@pytest.fixture(scope="session")
def shared_launch(request, tmp_path_factory) -> Callable[[int, str], str | None]:
    """``check(nranks, name)``: None when ``name`` passed in the one launch of every
    selected CPU file on ``nranks`` ranks (made on the first call), else why not."""
    runs: dict[int, tuple[int, str, dict[str, list[str]] | None]] = {}
    launched: dict[int, list[str]] = {}

    def check(nranks: int, name: str) -> str | None:
        if nranks not in runs:
            names = sorted(
                item.callspec.params["name"]
                for item in request.session.items
                if getattr(item, "originalname", None) == "test_on_ranks"
                and item.callspec.params["nranks"] == nranks
                and "gpu" not in item.callspec.params["name"]
            )
            logdir = tmp_path_factory.mktemp(f"ranks{nranks}")
            args = [f"tests/mpi/{n}" for n in names]
            code, logs = run_ranks(nranks, args, logdir, timeout=SHARED_TIMEOUT_S)
            runs[nranks] = (code, logs, failures(logdir, nranks))
            launched[nranks] = names
        code, logs, found = runs[nranks]
        if found is not None and found.get(name):
            return "\n".join(found[name]) + "\n" + logs
        failed = [] if found is None else [n for n, cases in found.items() if cases]
        if code == 0 or (failed and set(failed) <= set(launched[nranks])):
            return None  # passed here (a failure elsewhere in the launch fails that file)
        return f"the launch failed with no failing test reported (status {code}):\n{logs}"

    return check


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("name", FILES)
def test_on_ranks(name: str, nranks: int, tmp_path: Path, shared_launch) -> None:
    if "gpu" in name:
        if not GPU:
            pytest.skip("needs CuPy and a CUDA GPU")
        code, logs = run_ranks(nranks, [f"tests/mpi/{name}"], tmp_path)
        assert code == 0, f"{name} failed on {nranks} ranks:\n{logs}"
        return
    why = shared_launch(nranks, name)
    assert why is None, f"{name} failed on {nranks} ranks:\n{why}"
