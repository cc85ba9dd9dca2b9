"""``hvdlite-run --check-build``: which frameworks, bootstrap mechanisms and backends this installation has.

Backends come from the core itself (``hvdlite_build_info``); frameworks and mpi4py are looked up without being
imported, so the report is quick.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import List, Tuple


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def report() -> str:
    import hvdlite
    from hvdlite.common import binding
    from hvdlite.common.build_queries import mpi_facts

    info = mpi_facts()
    backends = set(filter(None, info.get("backends", "").split(",")))

    def section(title: str, rows: List[Tuple[str, bool]]) -> List[str]:
        return [title] + ["    [%s] %s" % ("X" if present else " ", name) for name, present in rows] + [""]

    lines = ["hvdlite v%s:" % hvdlite.__version__, ""]
    lines += section(
        "Available Frameworks:",
        [
            ("PyTorch", _has_module("torch") and _has_module("hvdlite.torch")),
            ("TensorFlow", _has_module("tensorflow") and _has_module("hvdlite.tensorflow")),
        ],
    )
    lines += section(
        "Available Controllers (bootstrap):",
        [
            ("built-in (hvdlite-run rendezvous, torchrun, Slurm)", True),
            ("MPI (mpi4py)", _has_module("mpi4py")),
            ("mpirun for --mpi", shutil.which("mpirun") is not None),
        ],
    )
    compiled = binding.mode == "compiled"
    lines += section(
        "Binding to the core:",
        [
            (
                "compiled (cffi API mode)"
                if compiled
                else "compiled: %s; bound through cffi's ABI mode, about 0.2 us more a call"
                % (
                    "not used, HVDLITE_CORE_LIBRARY names the core"
                    if os.environ.get("HVDLITE_CORE_LIBRARY")
                    else "not in this installation"
                ),
                compiled,
            ),
            (
                "per-tensor calls in C (hvdlite._fast_calls)"
                if binding.fast_calls is not None
                else "per-tensor calls in C: not used%s; their steady state runs in Python"
                % ("" if compiled else " without the compiled binding"),
                binding.fast_calls is not None,
            ),
        ],
    )
    mpi = info.get("mpi") == "1"
    mpi_row = "MPI (%s)" % info.get("mpi_library", "") if mpi else "MPI: %s" % info.get("mpi_missing", "not built")
    nccl = info.get("nccl") == "1"
    if nccl:
        version = int(info.get("nccl_version", "0"))
        nccl_row = "NCCL %d.%d.%d for CUDA tensors (%s, %s device(s))" % (
            version // 10000,
            version // 100 % 100,
            version % 100,
            info.get("nccl_library", ""),
            info.get("cuda_devices", "?"),
        )
    else:
        nccl_row = "NCCL: %s" % info.get("nccl_missing", "not available")
    lines += section(
        "Available Tensor Operations:",
        [
            ("TCP", "tcp" in backends),
            ("shared memory", "shm" in backends),
            (mpi_row, mpi),
            (nccl_row, nccl),
        ],
    )
    return "\n".join(lines)
