"""``coccl.virtual_ranks``: the virtual-rank simulator, kept at this import path
(``coccl.algorithms.virtual_ranks`` holds it)."""

from coccl.algorithms.virtual_ranks import *  # noqa: F403
from coccl.algorithms.virtual_ranks import __all__  # noqa: F401
