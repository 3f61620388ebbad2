"""Transports (L2): the bootstrap (small agreements between ranks), MPI and NCCL
point-to-point, and NCCL's link and topology detection. They move bytes and import only
the foundation; nothing here is loaded until a module is asked for (importing
``mpi4py.MPI`` initialises MPI)."""
