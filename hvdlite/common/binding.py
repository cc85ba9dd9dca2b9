"""cffi binding to the core's C ABI.

A source build compiles cffi's binding (`hvdlite._hvdlite_binding`, API mode, CPython's stable ABI) beside the
core: each call is a direct C call. Where it is absent (the manylinux wheel, other Python implementations) or
HVDLITE_CORE_LIBRARY names another core, the core is loaded with dlopen and bound in ABI mode, whose calls go
through libffi: the same interface, about 0.2 us more a call. Both read the declarations from hvdlite.h itself, so
the header stays the single source of truth.
"""

import glob
import importlib.util
import os
import sys

import cffi

from hvdlite.common.cuda_libraries import export_wheel_libraries
from hvdlite.common.declarations import declarations
from hvdlite.common.errors import error_for_status

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_HEADER = os.path.join(os.path.dirname(_PACKAGE_DIR), "hvdlite_core", "include", "hvdlite.h")


def _find(patterns, what):
    for pattern in patterns:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[0]
    raise ImportError(f"hvdlite: cannot find {what}; was the package built? (pip install -e . compiles the core)")


def _compiled_binding():
    """The compiled module beside this package's core, loaded from its file: an import by name could find another
    checkout's (an editable install's finder maps the name), bound to that checkout's core."""
    paths = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_hvdlite_binding.*so")))
    if not paths:
        return None
    name = "hvdlite._hvdlite_binding"
    spec = importlib.util.spec_from_file_location(name, paths[0])
    try:
        module = importlib.util.module_from_spec(spec)  # an extension module is loaded here
        spec.loader.exec_module(module)
    except ImportError:  # built for another interpreter, or against a core it no longer matches: ABI mode serves
        return None
    sys.modules[name] = module
    return module


def _load():
    # Before the core reads its configuration: CUDA and NCCL from pip wheels, for CUDA tensors (NCCL data plane).
    export_wheel_libraries()
    library = os.environ.get("HVDLITE_CORE_LIBRARY")
    if not library:
        compiled = _compiled_binding()
        if compiled is not None:
            return compiled.ffi, compiled.lib, "compiled"
        library = _find([os.path.join(_PACKAGE_DIR, "_hvdlite_core.so")], "the core library (_hvdlite_core.so)")
    header = _find([os.path.join(_PACKAGE_DIR, "hvdlite.h"), _REPO_HEADER], "hvdlite.h")
    ffi = cffi.FFI()
    ffi.cdef(declarations(header))
    return ffi, ffi.dlopen(library), "abi"


ffi, lib, mode = _load()  # mode: "compiled" or "abi", for diagnostics (hvdlite-run --check-build)


def _fast_calls():
    """hvdlite._fast_calls (hvdlite/common/fast_calls.c), loaded from its file beside the core as the binding is;
    None where it was not built or cannot load. Only with the compiled binding: it is linked to the package's own
    core, which ABI mode may not have loaded (HVDLITE_CORE_LIBRARY names another)."""
    paths = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_fast_calls.*so")))
    if mode != "compiled" or not paths:
        return None
    name = "hvdlite._fast_calls"
    spec = importlib.util.spec_from_file_location(name, paths[0])
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:  # an interpreter older than its stable ABI (3.10): the calls stay in Python
        return None
    sys.modules[name] = module
    return module


fast_calls = _fast_calls()


def last_error() -> str:
    return ffi.string(lib.hvdlite_last_error()).decode(errors="replace")


def check(status: int) -> None:
    """Raises the exception matching a non-zero status, with the core's message for this thread."""
    if status != 0:
        raise error_for_status(status, last_error())
