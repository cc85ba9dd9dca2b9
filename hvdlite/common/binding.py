"""cffi (ABI mode) binding to the core's C ABI.

The declarations are read from hvdlite.h itself, so the header stays the single source of truth. Nothing
here is compiled: the shared library is loaded with dlopen.
"""

import glob
import os
import re

import cffi

from hvdlite.common.cuda_libraries import export_wheel_libraries
from hvdlite.common.errors import error_for_status

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_HEADER = os.path.join(os.path.dirname(_PACKAGE_DIR), "hvdlite_core", "include", "hvdlite.h")


def _find(patterns, what):
    for pattern in patterns:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[0]
    raise ImportError(f"hvdlite: cannot find {what}; was the package built? (pip install -e . compiles the core)")


def _declarations(header_path):
    with open(header_path) as f:
        text = f.read()
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _load():
    # Before the core reads its configuration: CUDA and NCCL from pip wheels, for CUDA tensors (NCCL data plane).
    export_wheel_libraries()
    library = os.environ.get("HVDLITE_CORE_LIBRARY") or _find(
        [os.path.join(_PACKAGE_DIR, "_hvdlite_core.so")], "the core library (_hvdlite_core.so)"
    )
    header = _find([os.path.join(_PACKAGE_DIR, "hvdlite.h"), _REPO_HEADER], "hvdlite.h")
    ffi = cffi.FFI()
    ffi.cdef(_declarations(header))
    return ffi, ffi.dlopen(library)


ffi, lib = _load()


def last_error() -> str:
    return ffi.string(lib.hvdlite_last_error()).decode(errors="replace")


def check(status: int) -> None:
    """Raises the exception matching a non-zero status, with the core's message for this thread."""
    if status != 0:
        raise error_for_status(status, last_error())
