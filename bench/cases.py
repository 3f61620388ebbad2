"""The (datatype, op) cases of a collective sweep (``-d float32,bfloat16``, ``-d all``,
``-o all``) and the (algorithm, compressor) pairs that can run in each.

Each pair is probed on an empty buffer before the sweep starts: coccl refuses what it
cannot run before any byte moves, alike on every rank (a lossy codec with an integer
type or a ``max``), so a pair it refuses is skipped, with a note saying why, and the rest
of the sweep runs. Only a request of which nothing can run is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

Pair = tuple[str, str]  # (algorithm, compressor)


class NothingToRun(Exception):
    """No (datatype, op, algorithm, compressor) of a request can run; says why."""


@dataclass
class Case:
    """One datatype and op of a sweep.

    Attributes:
        sweep: the ``Sweep`` of this datatype and op (``collective.Sweep``).
        variants: the pairs that run with them, in the order asked.
        native_ok: the native baseline runs with them (then it is a row of its own and
            every row's speedup is over it).
        native_problem: why the baseline does not run ("" if it does).
        counts: the element counts of the sweep's sizes (set when the sweep starts).
    """

    sweep: Any
    variants: list[Pair]
    native_ok: bool
    native_problem: str = ""
    counts: list[int] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        """``float32 sum`` (``none`` for AllGather, which takes no op)."""
        return f"{self.sweep.dtype.name} {redop(self.sweep)}"


def redop(sweep: Any) -> str:
    """The op a sweep's rows name: its op, or ``none`` for a collective without one."""
    return sweep.op if sweep.spec.reduces else "none"


def problem(sweep: Any, pair: Pair, codecs: dict[str, Any]) -> str | None:
    """Why coccl refuses ``pair`` with the sweep's datatype and op (None: it runs): the
    pair is called on an empty buffer, which moves no byte."""
    algorithm, name = pair
    x = sweep.xp.empty(0, dtype=sweep.dtype)
    try:
        sweep.caller(algorithm, codecs[name], x, None)()
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def make_cases(
    base: Any, dtypes: list[Any], ops: list[str], variants: list[Pair], codecs: dict[str, Any]
) -> tuple[list[Case], list[dict[str, str]]]:
    """Every (datatype, op) of the request with the pairs that run in it, and one record
    per skipped (datatype, op, pair): ``type``, ``redop``, ``algorithm``, ``compressor``,
    ``reason``. A case where no pair runs is left out.

    Raises:
        NothingToRun: no pair runs in any case (the reasons named).
    """
    cases: list[Case] = []
    skipped: list[dict[str, str]] = []
    for dtype in dtypes:
        for op in ops if base.spec.reduces else ops[:1]:
            sweep = dataclasses.replace(base, dtype=dtype, op=op)
            kept = []
            for pair in variants:
                reason = problem(sweep, pair, codecs)
                if reason is None:
                    kept.append(pair)
                    continue
                skipped.append(
                    {"type": dtype.name, "redop": redop(sweep), "algorithm": pair[0],
                     "compressor": pair[1], "reason": reason}
                )  # fmt: skip
            native = problem(sweep, ("native", "identity"), codecs)
            if kept:
                cases.append(Case(sweep, kept, native is None, native or ""))
    if not cases:
        raise NothingToRun("nothing can run: " + "; ".join(skip_notes(skipped)))
    return cases, skipped


def skip_notes(skipped: list[dict[str, str]]) -> list[str]:
    """One line per reason: ``skipped ring/taco, two_shot/taco with int32 sum: compressor
    'taco' does not support dtype int32 (...)``; a reason that did not skip every pair it
    names in every case it names gets one line per (pair, case) instead."""
    by_reason: dict[str, list[dict[str, str]]] = {}
    for entry in skipped:
        by_reason.setdefault(entry["reason"], []).append(entry)
    lines = []
    for reason, entries in by_reason.items():
        pairs = dict.fromkeys(f"{e['algorithm']}/{e['compressor']}" for e in entries)
        cases = dict.fromkeys(f"{e['type']} {e['redop']}" for e in entries)
        if len(pairs) * len(cases) == len(entries):  # each entry is one (pair, case)
            lines.append(f"skipped {', '.join(pairs)} with {', '.join(cases)}: {reason}")
            continue
        for e in entries:
            pair = f"{e['algorithm']}/{e['compressor']}"
            lines.append(f"skipped {pair} with {e['type']} {e['redop']}: {reason}")
    return lines
