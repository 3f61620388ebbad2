"""Engines (L2): what runs a schedule's rounds once they are handed over: the polling
engine (MPI, host or staged), the streamed engine (NCCL on coccl's streams), device
contexts, the watchdog, and CUDA graph capture with its rebasing. Imports only the
foundation."""
