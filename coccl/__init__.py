"""coccl: compressible collective communication.

AllReduce, ReduceScatter and AllGather written as ring and two-shot schedules over MPI or
NCCL point-to-point, with pluggable compressors (TACO FP8, INT8, identity) on the wire.

    import coccl
    comm = coccl.init()
    y = comm.allreduce(x, compressor="taco", algorithm="two_shot")
"""

from typing import Any

from coccl.compressors import (
    Compressor,
    available_compressors,
    get_compressor,
    register_compressor,
)
from coccl.core.handles import CallHandle, NotifyingHandle
from coccl.errors import CocclError

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The Communicator imports mpi4py, and importing mpi4py.MPI initialises MPI. Load it
    # on first use, so that `import coccl` (e.g. for the codecs alone, or in a launcher
    # that then starts mpiexec, which Open MPI refuses from an MPI process) does not.
    if name in ("init", "Communicator"):
        from coccl import communicator  # noqa: PLC0415

        return getattr(communicator, name)
    if name in ("DeltaState", "Feedback"):
        from coccl.communicator import state  # noqa: PLC0415

        return getattr(state, name)
    if name in ("P2POp", "P2PHandle"):
        from coccl.communicator import p2p_calls  # noqa: PLC0415

        return getattr(p2p_calls, name)
    raise AttributeError(f"module 'coccl' has no attribute {name!r}")


__all__ = [
    "CallHandle",
    "CocclError",
    "Communicator",
    "Compressor",
    "DeltaState",
    "Feedback",
    "NotifyingHandle",
    "P2PHandle",
    "P2POp",
    "available_compressors",
    "get_compressor",
    "init",
    "register_compressor",
]
