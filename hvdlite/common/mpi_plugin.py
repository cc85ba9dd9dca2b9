"""The MPI data plane's plugin, compiled on the machine that uses it, the first time a job asks for it.

The core never links MPI (hvdlite_core/plugins/mpi/mpi_plugin_abi.h says why). Its plugin is one C++ file that
must be compiled against the MPI of the machine it runs on, and that MPI is often installed after hvdlite, or
differs from the one of the machine that built a wheel. So it is not built with the package: the first job that
needs it (``HVDLITE_CPU_OPERATIONS=mpi``, ``hvdlite-run --mpi``, ``hvd.mpi_built()``) compiles it with the flags
of the ``mpicc`` on PATH into a cache keyed by the source, the compiler and those flags, and every later job
loads it from there. Ranks starting together take a file lock, so one compiles and the others wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import List, Optional, Tuple

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A wheel ships the plugin's source inside the package (setup.py copies it); a source checkout has it here.
_SOURCE_DIRS = [
    os.path.join(_PACKAGE_DIR, "mpi_plugin"),
    os.path.join(os.path.dirname(_PACKAGE_DIR), "hvdlite_core", "plugins", "mpi"),
]
_SOURCE, _HEADER = "mpi_plugin.cc", "mpi_plugin_abi.h"
PLUGIN_NAME = "_hvdlite_mpi.so"

#: The one command that gives a Debian or Ubuntu machine what the plugin needs.
INSTALL_HINT = "apt-get install -y openmpi-bin libopenmpi-dev (as root; or your MPI's development package)"

_lock = threading.Lock()
_result: Optional[Tuple[Optional[str], Optional[str]]] = None


def _env(name: str) -> Optional[str]:
    return os.environ.get("HVDLITE_" + name) or os.environ.get("HOROVOD_" + name) or None


def requested() -> bool:
    """Whether this process's job asked for the MPI data plane."""
    return (_env("CPU_OPERATIONS") or "").strip().lower() == "mpi"


def source_dir() -> Optional[str]:
    for folder in _SOURCE_DIRS:
        if os.path.isfile(os.path.join(folder, _SOURCE)) and os.path.isfile(os.path.join(folder, _HEADER)):
            return folder
    return None


def mpi_flags() -> Tuple[Optional[str], List[str], List[str]]:
    """(wrapper path, compile flags, link flags) of the MPI whose C compiler wrapper is first on PATH (Open MPI
    answers --showme:compile/--showme:link, MPICH -compile_info/-link_info), or (None, [], []) without one. The C
    wrapper's flags suffice: the plugin uses MPI's C API only."""
    for wrapper in ("mpicc", "mpicxx", "mpic++"):
        path = shutil.which(wrapper)
        if not path:
            continue
        for compile_query, link_query, skip_first in (
            ("--showme:compile", "--showme:link", False),
            ("-compile_info", "-link_info", True),
        ):
            try:
                compiled = subprocess.run([path, compile_query], capture_output=True, text=True, timeout=60)
                linked = subprocess.run([path, link_query], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if compiled.returncode == 0 and linked.returncode == 0:
                cflags, lflags = shlex.split(compiled.stdout), shlex.split(linked.stdout)
                if skip_first:  # MPICH prints the whole command line, compiler first
                    cflags, lflags = cflags[1:], lflags[1:]
                # MPICH's -compile_info also carries -c and the like: keep what names headers and libraries.
                cflags = [f for f in cflags if f.startswith(("-I", "-D", "-pthread"))]
                lflags = [f for f in lflags if f.startswith(("-L", "-l", "-Wl,", "-pthread"))]
                return path, cflags, lflags
    return None, [], []


def _compiler() -> Optional[str]:
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        path = shutil.which(name)
        if path:
            return path
    return None


def cache_dir() -> str:
    """Where built plugins are kept: HVDLITE_MPI_PLUGIN_CACHE, else the user's cache folder."""
    explicit = _env("MPI_PLUGIN_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hvdlite", "mpi-plugin")


def _build(folder: str, compiler: str, cflags: List[str], lflags: List[str], target: str) -> Optional[str]:
    """Compiles the plugin into ``target`` (atomically); None on success, else the compiler's complaint."""
    staging = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(target))
    try:
        output = os.path.join(staging, PLUGIN_NAME)
        command = [
            compiler,
            "-std=c++17",
            "-O2",
            "-g0",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-I",
            folder,
            *cflags,
            os.path.join(folder, _SOURCE),
            "-o",
            output,
            *lflags,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return "%s: %s" % (shlex.join(command), exc)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
            return "%s failed:\n%s" % (shlex.join(command), tail)
        os.replace(output, target)
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _find_or_build() -> Tuple[Optional[str], Optional[str]]:
    folder = source_dir()
    if folder is None:
        return None, "this hvdlite installation lacks the MPI plugin's source (%s); reinstall hvdlite" % _SOURCE
    wrapper, cflags, lflags = mpi_flags()
    if wrapper is None:
        return None, (
            "hvdlite compiles its MPI plugin on first use against the MPI whose compiler wrapper (mpicc) "
            "is on PATH, and none is; install an MPI with its development files: " + INSTALL_HINT
        )
    compiler = _compiler()
    if compiler is None:
        return None, (
            "no C++ compiler (c++, g++, clang++ or $CXX) to compile the MPI plugin against %s: the plugin is the "
            "one part of hvdlite compiled where it runs (once, then cached); install g++ or set CXX" % wrapper
        )
    digest = hashlib.sha256()
    for name in (_SOURCE, _HEADER):
        with open(os.path.join(folder, name), "rb") as f:
            digest.update(f.read())
    digest.update("\0".join([compiler, wrapper, *cflags, "|", *lflags]).encode())
    key = digest.hexdigest()[:20]
    root = cache_dir()
    target_dir = os.path.join(root, key)
    target = os.path.join(target_dir, PLUGIN_NAME)
    if os.path.isfile(target):
        return target, None
    try:
        os.makedirs(target_dir, exist_ok=True)
    except OSError as exc:
        return None, "cannot create the MPI plugin cache %s (%s); set HVDLITE_MPI_PLUGIN_CACHE" % (target_dir, exc)
    with open(os.path.join(root, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ranks starting together: one compiles, the others find its result
        if os.path.isfile(target):
            return target, None
        failure = _build(folder, compiler, cflags, lflags, target)
    if failure is not None:
        return None, "the MPI plugin did not compile against %s: %s" % (wrapper, failure)
    return target, None


def ensure() -> Tuple[Optional[str], Optional[str]]:
    """(plugin path, None), or (None, why not and how to fix it). A path given in HVDLITE_MPI_PLUGIN is the
    user's choice and used as it is; otherwise the plugin for this machine's MPI is found in the cache or built.
    The answer is exported as HVDLITE_MPI_PLUGIN, where the core reads it."""
    global _result
    with _lock:
        given = _env("MPI_PLUGIN")
        if given:
            return given, None
        if _result is None or _result[0] is None:  # a failure is retried: an MPI may have been installed since
            _result = _find_or_build()
        if _result[0] is not None:
            os.environ["HVDLITE_MPI_PLUGIN"] = _result[0]
        return _result


def main() -> int:
    """``python -m hvdlite.common.mpi_plugin``: finds or builds the plugin now (an image build, an admin
    preparing a cluster) and prints its path, or why it cannot be had."""
    plugin, why_not = ensure()
    if plugin is None:
        print("hvdlite: " + why_not, file=sys.stderr)
        return 1
    print(plugin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
