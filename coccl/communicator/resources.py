"""What a communicator holds and must free: its bootstrap and transports (MPI
duplicates, the NCCL communicator), the watchdog and the codec thread; and the numba
thread pool it sizes."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from coccl.engine.polling import CpuExecutor
from coccl.transports.bootstrap import Bootstrap


class Resources:
    """A communicator's transports, watchdog and codec thread, released together."""

    def __init__(self, boot: Bootstrap, host: Any, nccl: Any, watchdog: Any) -> None:
        self.boot, self.host, self.nccl, self.watchdog = boot, host, nccl, watchdog
        self.cpu: CpuExecutor | None = None
        self.p2p: Any = None  # the point-to-point engine and its transport, if any
        self.broken = False  # a failure after bytes moved (the communicator's _break)

    def release(self, abort: bool = False) -> None:
        """Free everything; ``abort`` (after a failure): abort NCCL, and keep the MPI
        duplicates, on which the failure may have left messages unmatched."""
        if self.cpu is not None:
            self.cpu.close()
        if self.watchdog is not None:
            if not abort:  # NCCL's destroy waits for unfinished calls: first let them end
                self.watchdog.drain()  # or time out (the watchdog aborts NCCL then)
            self.watchdog.close()
        if self.nccl is not None:
            if abort:
                self.nccl.abort()
            else:
                self.nccl.close()
        self.host.close(abandoned=abort)
        if self.p2p is not None:
            self.p2p.close(abandoned=abort)
        self.boot.close(abandoned=abort)


def release_unclosed(resources: Resources, name: str) -> None:
    """A communicator collected without ``close()``: free what it holds (an MPI library
    has a limited number of communicators) and say so."""
    warnings.warn(
        f"{name} was not closed; call close() (or use it as a context manager)",
        ResourceWarning,
        stacklevel=2,
    )
    resources.release(abort=resources.broken)


def set_numba_threads(threads: int) -> None:
    """Size numba's thread pool; starting numba's OpenMP layer resets the process's
    OpenMP thread count, so torch's intra-op count (if torch is loaded) is restored."""
    import numba  # noqa: PLC0415

    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    if torch_threads is not None and torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
