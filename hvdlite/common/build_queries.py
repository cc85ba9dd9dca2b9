"""Horovod's questions about the build (`hvd.mpi_built()`, `hvd.nccl_built()`, ...), answered once for every
framework adapter from what the core reports (``build_info()``): which backends this installation can use, and
which one the running job uses. The built-in TCP/shared-memory backend plays Gloo's part."""

from typing import Dict

from hvdlite.common import mpi_plugin
from hvdlite.common.basics import build_info


def build_facts() -> Dict[str, str]:
    """The core's build_info() as a dict (key=value;... -> {key: value})."""
    fields = {}
    for item in build_info().split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return fields


def mpi_facts() -> Dict[str, str]:
    """build_facts() after the MPI plugin for this machine's MPI was found or built (its first call on a machine
    compiles it: seconds); ``mpi_missing`` says why not and how to fix it."""
    plugin, why_not = mpi_plugin.ensure()
    facts = build_facts()
    if plugin is None:
        facts["mpi_missing"] = why_not
    return facts


def mpi_built() -> bool:
    """True when the MPI data plane can run here: the plugin is built for this machine's MPI (on the first call
    on a machine: hvdlite/common/mpi_plugin.py) and its MPI library loads. ``hvdlite-run --check-build`` says
    why not, otherwise."""
    return mpi_facts().get("mpi") == "1"


def mpi_enabled() -> bool:
    """True when the running job moves host tensors through MPI (HVDLITE_CPU_OPERATIONS=mpi or
    ``hvdlite-run --mpi``)."""
    return build_facts().get("cpu_operations") == "mpi"


def mpi_threads_supported() -> bool:
    """Whether the application may call MPI itself (mpi4py) while hvdlite runs: with the MPI data plane, hvdlite
    calls MPI from its background thread, so MPI must provide MPI_THREAD_MULTIPLE; otherwise hvdlite never calls
    MPI and any use of it is safe."""
    info = build_facts()
    if info.get("cpu_operations") == "mpi":
        return info.get("mpi_thread_multiple") == "1"
    return True


def gloo_enabled() -> bool:
    """The built-in TCP/shared-memory backend plays Gloo's part; it carries negotiation in every job."""
    return True


def gloo_built() -> bool:
    return True


def nccl_built() -> bool:
    """True when collectives on CUDA tensors can run here: hvdlite loads the CUDA runtime and NCCL at run time
    (HVDLITE_CUDART_LIBRARY / HVDLITE_NCCL_LIBRARY, else the usual names) and a device is visible;
    ``hvdlite-run --check-build`` says why not, otherwise."""
    return build_facts().get("nccl") == "1"


def cuda_built() -> bool:
    """CUDA tensors are supported exactly where NCCL is (the NCCL data plane is hvdlite's only GPU path)."""
    return nccl_built()


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Horovod's query (horovod.common.util.gpu_available): whether collectives on framework ext_base_name's
    GPU tensors run on the device. 'torch': CUDA tensors use the NCCL data plane where nccl_built().
    'tensorflow' (and any other framework): False, as TensorFlow's GPU tensors reach the core through host memory
    like all of its tensors. verbose prints why not."""
    framework = ext_base_name.rsplit(".", 1)[-1]
    if framework == "torch":
        available, why_not = nccl_built(), "no CUDA runtime, NCCL or visible device (hvdlite-run --check-build)"
    else:
        available, why_not = False, f"hvdlite passes {framework}'s tensors through host memory"
    if verbose and not available:
        print(f"hvdlite: collectives on {framework} GPU tensors do not run on the device: {why_not}")
    return available


def rocm_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False
