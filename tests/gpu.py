"""Whether CuPy and a CUDA GPU are usable here (GPU tests skip cleanly otherwise)."""


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU = gpu_available()
