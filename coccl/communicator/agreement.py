"""Agreement between ranks: that every rank makes the same call, and that every rank
has the same schedule-shaping settings. Both raise on every rank, naming what differs,
before any byte of the call moves."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from coccl.communicator.sizing import local_cpu_threads
from coccl.config import SCHEDULE_SETTINGS, SETTING_VARIABLES, Settings
from coccl.errors import CocclError
from coccl.transports.bootstrap import Bootstrap


class CallAgreement:
    """The agreement of one communicator's calls (``agree_on_call``), and the entries of
    calls without a plan already agreed on.

    Args:
        boot: the communicator's bootstrap, which carries the exchanges.
        settings: its ``COCCL_*`` settings (the timeout; ``check_calls``).
        on_failure: called with the exception when an exchange fails (the communicator
            breaks).
    """

    KEPT = 4096  # entries remembered (then forgotten, and agreed again), as a plan cache

    def __init__(
        self, boot: Bootstrap, settings: Settings, on_failure: Callable[[BaseException], None]
    ) -> None:
        self.boot, self.settings, self.on_failure = boot, settings, on_failure
        self._agreed: set[tuple[str, str]] = set()

    def agree(self, collective: str, entry: Any, error: BaseException | None) -> None:
        """``agree_on_call`` of this communicator."""
        agree_on_call(self.boot, self.settings.timeout_s, collective, entry, error, self.on_failure)

    def agree_once(self, collective: str, entry: Any, error: BaseException | None) -> None:
        """``agree`` for a call without a plan (a rooted call, a bucket): a refusal always,
        otherwise the first call of each entry, as a plan's first call (every call with
        COCCL_CHECK_CALLS=1)."""
        signature = (collective, repr(entry))
        if error is None and signature in self._agreed and not self.settings.check_calls:
            return
        self.agree(collective, entry, error)
        if len(self._agreed) >= self.KEPT:
            self._agreed.clear()
        self._agreed.add(signature)


def agree_on_call(
    boot: Bootstrap,
    timeout_s: float,
    collective: str,
    entry: Any,
    error: BaseException | None,
    on_failure: Callable[[BaseException], None],
) -> None:
    """Compare this rank's entry with every rank's; raise on every rank if any rank
    refused the call (``error``) or the ranks disagree. One small exchange of digests
    when they agree; the entries themselves, to name the difference, when they do not.
    A failed exchange is passed to ``on_failure`` (the communicator breaks) and raised."""
    what = f"checking that every rank makes the same {collective} call"
    digest = hashlib.sha1(repr(entry).encode()).hexdigest()
    try:
        digests = boot.allgather(digest, timeout_s, what)
        entries = None
        if any(d != digests[0] for d in digests):
            entries = boot.allgather(entry, timeout_s, what)
    except CocclError as exc:
        on_failure(exc)
        raise
    if error is not None:
        raise error
    if entries is None:
        return
    problem = disagreement(collective, entries)
    if problem is not None:
        raise CocclError(problem)


def is_digest(entry: Any) -> bool:
    """Whether ``entry`` is the first exchange of ``agree_on_call`` (a sha1 hex digest)."""
    return (
        isinstance(entry, str) and len(entry) == 40 and all(c in "0123456789abcdef" for c in entry)
    )


def ranks_in_other_calls(
    entries: list[Any],
    is_mine: Callable[[Any], bool],
    exchange: Callable[[Any], list[Any]],
    refusal: str,
) -> list[int]:
    """The ranks whose entry in a one-exchange agreement (an all-to-all's, a split's) is
    not of that kind: they make another call. A rank in ``agree_on_call`` sent a digest
    and waits for a second exchange; every rank here saw the same entries, so all of
    them join it with ``("error", refusal)``: that rank then raises ``CocclError`` at once
    instead of waiting for COCCL_TIMEOUT_S, and the exchanges stay paired."""
    others = [r for r, e in enumerate(entries) if not is_mine(e)]
    if any(is_digest(entries[r]) for r in others):
        exchange(("error", refusal))
    return others


def disagreement(collective: str, theirs: list[Any]) -> str | None:
    """Why the ranks' entries differ (None if they do not). An entry is a plan's
    fingerprint, or ``("error", message)`` for a rank that refused the call."""
    errors = [(r, e[1]) for r, e in enumerate(theirs) if isinstance(e, tuple)]
    if errors:
        rank, message = errors[0]
        return f"rank {rank} refused this {collective}: {message}"
    if all(f == theirs[0] for f in theirs):
        return None
    keys = [k for k in theirs[0] if any(f.get(k) != theirs[0].get(k) for f in theirs)]
    if "collective" in keys:  # different calls: their other fields say nothing more
        keys = ["collective"]
    detail = "; ".join(
        f"{k}: " + ", ".join(f"rank {r} {f.get(k)!r}" for r, f in enumerate(theirs)) for k in keys
    )
    return f"the ranks do not make the same {collective} call ({detail})"


def agree_settings(boot: Bootstrap, conf: Settings, local_size: int) -> tuple[int, bool]:
    """Check that every rank has the same schedule-shaping settings (CocclError naming
    the variable and each rank's value otherwise); return this rank's codec threads and
    whether host data is pipelined, decided alike on every rank: only if every rank has
    a spare core for its codec thread (COCCL_CPU_THREADS or cores per local rank >= 2)."""
    threads = local_cpu_threads(local_size, conf.cpu_threads)
    mine = {name: getattr(conf, name) for name in SCHEDULE_SETTINGS}
    entries = boot.allgather((mine, threads), conf.timeout_s, "comparing COCCL_* settings")
    for name in SCHEDULE_SETTINGS:
        values = [e[0][name] for e in entries]
        if any(v != values[0] for v in values):
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise CocclError(
                f"{SETTING_VARIABLES[name]} differs between ranks ({per_rank}); settings "
                "that shape a collective's schedule must be the same on every rank"
            )
    return threads, min(t for _, t in entries) >= 2
