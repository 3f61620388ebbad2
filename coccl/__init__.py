"""coccl: compressible collective communication.

AllReduce, ReduceScatter and AllGather written as ring and two-shot schedules over MPI or
NCCL point-to-point, with pluggable compressors (TACO FP8, INT8, identity) on the wire.

    import coccl
    comm = coccl.init()
    y = comm.allreduce(x, compressor="taco", algorithm="two_shot")
"""

from coccl.communicator import Communicator, init
from coccl.compressors import (
    Compressor,
    available_compressors,
    get_compressor,
    register_compressor,
)
from coccl.errors import CocclError

__version__ = "0.1.0"

__all__ = [
    "CocclError",
    "Communicator",
    "Compressor",
    "available_compressors",
    "get_compressor",
    "init",
    "register_compressor",
]
