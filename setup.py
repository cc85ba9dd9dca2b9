"""Build and packaging for hvdlite.

The C++ core (hvdlite_core/) is compiled into one shared library placed inside the `hvdlite` package. It is
loaded at run time through cffi's ABI mode, so nothing is compiled against Python, PyTorch or TensorFlow: one
build works with any framework version. Only a C++17 compiler is needed.

Optional dependencies are pinned here, in one place; README and .ci/run install through these extras.
"""
import glob
import os
import shlex
import shutil
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join("hvdlite_core")
SOURCES = sorted(glob.glob(os.path.join(CORE, "src", "**", "*.cc"), recursive=True))
HEADER = os.path.join(CORE, "include", "hvdlite.h")


class BuildCore(build_ext):
    """Compiles the core as a plain shared library (no Python module init) and ships the C header with it."""

    def build_extensions(self):
        compiler = self.compiler
        if ".cc" not in compiler.src_extensions:
            compiler.src_extensions.append(".cc")
        # distutils passes C flags meant for the interpreter's own build; -Wstrict-prototypes is C-only.
        compiler.compiler_so = [f for f in compiler.compiler_so if f != "-Wstrict-prototypes"]
        self.parallel = self.parallel or min(2, os.cpu_count() or 1)
        super().build_extensions()
        for ext in self.extensions:
            target_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(target_dir, exist_ok=True)
            shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(target_dir, "hvdlite.h"))

    def copy_extensions_to_source(self):
        # Replace the in-place library atomically: running ranks keep their mapping of the old file instead
        # of crashing on a truncated one.
        for ext in self.extensions:
            built = os.path.join(self.build_lib, self.get_ext_filename(ext.name))
            target = os.path.join(HERE, self.get_ext_filename(ext.name))
            staging = target + ".tmp"
            shutil.copyfile(built, staging)
            os.replace(staging, target)
            shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(os.path.dirname(target), "hvdlite.h"))

    def get_export_symbols(self, ext):
        return []  # not a Python extension module: no PyInit_ symbol to export


def mpi_flags():
    """Compile and link flags of the MPI that mpicxx/mpicc belong to (Open MPI: --showme, MPICH: -compile_info),
    or None when there is no MPI. HVDLITE_WITHOUT_MPI=1 skips the MPI plugin (Horovod's HOROVOD_WITHOUT_MPI)."""
    if os.environ.get("HVDLITE_WITHOUT_MPI", os.environ.get("HOROVOD_WITHOUT_MPI", "0")) not in ("", "0"):
        return None
    for wrapper in ("mpicc", "mpicxx", "mpic++"):  # the C wrapper's flags: the plugin uses MPI's C API only
        path = shutil.which(wrapper)
        if not path:
            continue
        for compile_query, link_query, skip_first in (("--showme:compile", "--showme:link", False),
                                                      ("-compile_info", "-link_info", True)):
            try:
                compile_flags = subprocess.run([path, compile_query], capture_output=True, text=True, timeout=60)
                link_flags = subprocess.run([path, link_query], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if compile_flags.returncode == 0 and link_flags.returncode == 0:
                cflags, lflags = shlex.split(compile_flags.stdout), shlex.split(link_flags.stdout)
                if skip_first:  # MPICH prints the whole command line, compiler first
                    cflags, lflags = cflags[1:], lflags[1:]
                # MPICH's -compile_info also carries -c and the like: keep what names headers and libraries
                cflags = [f for f in cflags if f.startswith(("-I", "-D", "-pthread"))]
                lflags = [f for f in lflags if f.startswith(("-L", "-l", "-Wl,", "-pthread"))]
                return cflags, lflags
    return None


core = Extension(
    "hvdlite._hvdlite_core",
    sources=SOURCES,
    include_dirs=[os.path.join(CORE, "include"), os.path.join(CORE, "src")],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-fvisibility=hidden", "-pthread", "-Wall", "-Wno-unused-parameter"],
    extra_link_args=["-pthread", "-lrt"],
    depends=glob.glob(os.path.join(CORE, "**", "*.h"), recursive=True),
)

# The MPI data plane is a plugin beside the core (hvdlite_core/plugins/mpi/mpi_plugin_abi.h says why), built
# only where an MPI is found; the core loads it when a job asks for HVDLITE_CPU_OPERATIONS=mpi.
EXTENSIONS = [core]
MPI_FLAGS = mpi_flags()
if MPI_FLAGS is not None:
    EXTENSIONS.append(Extension(
        "hvdlite._hvdlite_mpi",
        sources=[os.path.join(CORE, "plugins", "mpi", "mpi_plugin.cc")],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden", "-Wall"] + MPI_FLAGS[0],
        extra_link_args=MPI_FLAGS[1],
        depends=[os.path.join(CORE, "plugins", "mpi", "mpi_plugin_abi.h")],
    ))
elif os.environ.get("HVDLITE_WITH_MPI", os.environ.get("HOROVOD_WITH_MPI", "0")) not in ("", "0"):
    raise SystemExit("HVDLITE_WITH_MPI is set but no MPI was found: install one with its compiler wrappers "
                     "(e.g. apt-get install libopenmpi-dev) so that mpicxx or mpicc is on PATH")

TORCH = ["torch==2.13.0"]
TENSORFLOW = ["tensorflow-cpu==2.21.0", "keras>=3.0"]
TEST = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "numpy>=1.26"]
BENCH = ["matplotlib>=3.8", "numpy>=1.26"]
EXAMPLES = ["tqdm>=4.60"]
RAY = ["ray==2.58.0"]  # hvdlite.ray.RayExecutor
SPARK = ["pyspark==4.3.0"]  # hvdlite.spark.run; needs a Java 17+ runtime (tools/system-packages.sh installs one)
MPI = ["mpi4py>=3.1"]  # hvd.init() under mpirun, hvd.init(comm=...); needs an MPI library (Open MPI, MPICH)

setup(
    name="hvdlite",
    version="0.1.0",
    description="Horovod-compatible distributed deep-learning training with a fast built-in transport",
    # The launcher's sources live in the top-level launcher/ folder (the product's layout: core, package,
    # launcher side by side) and install as hvdlite.runner, the name Horovod users import (horovod.runner).
    packages=find_packages(include=["hvdlite", "hvdlite.*"]) + ["hvdlite.runner"],
    package_dir={"hvdlite.runner": "launcher"},
    ext_modules=EXTENSIONS,
    cmdclass={"build_ext": BuildCore},
    python_requires=">=3.9",
    install_requires=["cffi>=1.15", "cloudpickle>=2.0", "numpy>=1.26"],
    extras_require={
        "torch": TORCH,
        "tensorflow": TENSORFLOW,
        "test": TEST,
        "bench": BENCH,
        "examples": EXAMPLES,
        "mpi": MPI,
        "ray": RAY,
        "spark": SPARK,
        "dev": TORCH + TENSORFLOW + TEST + BENCH + EXAMPLES + MPI + RAY + SPARK,
    },
    entry_points={"console_scripts": ["hvdlite-run = hvdlite.runner.launch:main"]},
    zip_safe=False,
)
