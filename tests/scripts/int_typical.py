"""Print the ``int`` codec's typical errors (compressors/intq.py's ``_TYPICAL`` table):
the relative L2 roundtrip error on 2^20 Gaussian N(0, 1) samples, seed 0, per rounding,
bits and group size.

    python tests/scripts/int_typical.py
"""

from __future__ import annotations

import numpy as np

from coccl.compressors import get_compressor
from coccl.compressors.intq import BITS, GROUP_SIZES, ROUNDINGS


def main() -> None:
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    for rounding in ROUNDINGS:
        print(f'    "{rounding}": {{')
        for bits in BITS:
            row = []
            for g in GROUP_SIZES:
                c = get_compressor("int", bits=bits, group_size=g, rounding=rounding)
                y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
                row.append(f"{np.linalg.norm(y - x) / np.linalg.norm(x):.4g}")
            print(f"        {bits}: ({', '.join(row)}),")
        print("    },")


if __name__ == "__main__":
    main()
