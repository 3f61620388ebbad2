"""coccl-bench with one more codec registered: ``skewed_int8``, whose roundtrip is 25% too
large (a scale bug) while it declares int8's error bound, so every row it compresses must
come out wrong. Used by tests/test_bench.py and tests/test_bench_codec.py.

Usage: [mpiexec -n N python -m mpi4py] broken_codec_bench.py ARGS...  (coccl-bench's)
"""

import sys

import numpy as np

import coccl
from coccl.bench.cli import main
from coccl.compressors import Int8Compressor


@coccl.register_compressor
class SkewedInt8(Int8Compressor):
    codec_id = "skewed_int8"

    def encode_into(self, x, payload, dtype):
        super().encode_into(np.asarray(x * 1.25, dtype=x.dtype), payload, dtype)


sys.exit(main(sys.argv[1:]))
