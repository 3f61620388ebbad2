"""coccl for PyTorch (L4): ``import coccl.torch`` registers the torch.distributed backend
``"coccl"`` (``coccl.torch.backend``); ``coccl.torch.tensor_parallel`` holds the TP layers,
``coccl.torch.comm_hooks`` the DDP communication hook, ``coccl.torch.zero`` a ZeRO-1
sharded optimizer, ``coccl.torch.fsdp`` FSDP2's comm objects with coccl's codecs and
states, ``coccl.torch.policy`` a 3D job's per-dimension policy (``load_policy``).
Uses only public names of the layers below. The supported torch versions
(``coccl.torch.versions.TORCH_RANGE``) are checked first."""

import torch

from coccl.torch.versions import TORCH_RANGE, check_torch_version

check_torch_version(torch.__version__)

from coccl.torch.backend import (  # noqa: E402  (after the version check)
    BACKEND,
    DEFAULT_MIN_COMPRESS_BYTES,
    CocclOptions,
    CocclProcessGroup,
    CocclWork,
    _reduce_op,  # noqa: F401  (the tests check the ReduceOp mapping)
    create_group,
    in_backward,
    options,
    register_backend,
)
from coccl.torch.comm_hooks import CocclHookState, allreduce_hook  # noqa: E402
from coccl.torch.fsdp import fsdp_comms, shard_comms  # noqa: E402
from coccl.torch.introspect import describe, stats  # noqa: E402
from coccl.torch.launch import init_process_group  # noqa: E402
from coccl.torch.policy import (  # noqa: E402
    Policy,
    PolicyError,
    Traffic,
    load_policy,
    named_policy,
)
from coccl.torch.zero import ShardedOptimizer  # noqa: E402

__all__ = [
    "BACKEND",
    "DEFAULT_MIN_COMPRESS_BYTES",
    "CocclHookState",
    "CocclOptions",
    "CocclProcessGroup",
    "CocclWork",
    "ShardedOptimizer",
    "Policy",
    "PolicyError",
    "TORCH_RANGE",
    "Traffic",
    "allreduce_hook",
    "create_group",
    "describe",
    "fsdp_comms",
    "in_backward",
    "init_process_group",
    "load_policy",
    "named_policy",
    "options",
    "register_backend",
    "shard_comms",
    "stats",
]
