"""The foundation (L0): arrays and streams, buffer pools, pipeline rounds, reduction
arithmetic and the declared transport protocols. It imports nothing else of coccl but
``coccl.errors`` and ``coccl.config``."""
