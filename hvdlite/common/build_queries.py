"""Horovod's questions about the build (`hvd.mpi_built()`, `hvd.nccl_built()`, ...), answered once for every
framework adapter. The answers are what this build can do, not what a user asked for: the built-in TCP/shared-
memory backend plays Gloo's part, the core reports its optional backends in build_info(), and there is no GPU
backend yet."""
from hvdlite.common.basics import build_info


def mpi_threads_supported() -> bool:
    """hvdlite's core is thread-safe whatever backend is used."""
    return True


def mpi_enabled() -> bool:
    return "mpi=1" in build_info()


def mpi_built() -> bool:
    return mpi_enabled()


def gloo_enabled() -> bool:
    """The built-in TCP/shared-memory backend plays Gloo's part."""
    return True


def gloo_built() -> bool:
    return True


def nccl_built() -> bool:
    return "nccl=1" in build_info()


def cuda_built() -> bool:
    """False: this build has no CUDA backend; collectives take host (CPU) tensors."""
    return False


def rocm_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False
