"""The core keeps a statically linked C++ runtime private. Some toolchains link their own libstdc++ into every
shared library (the GPU image's /opt/gcc does), and the manylinux build links LLVM's libc++ in; exported from the
core, that copy's symbols mix with the older libstdc++ torch loads, and the core's first iostream call crashes
inside torch processes (seen on an H100 machine). The link flags of setup.py must hide it: a library linked from
the core's own code with them, and -static-libstdc++, exports none of libstdc++'s symbols, where without them it
exports hundreds."""

from __future__ import annotations

import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "hvdlite_core", "src", "runtime", "message.cc")  # shape_string: an ostringstream


def core_link_args() -> list:
    """extra_link_args of the core's Extension in setup.py."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            for keyword in node.keywords:
                if keyword.arg == "extra_link_args":
                    return ast.literal_eval(keyword.value)
    raise AssertionError("setup.py has no Extension with extra_link_args")


def exported_libstdcxx_symbols(tmp_path, link_args) -> int:
    library = tmp_path / "libcore_part.so"
    subprocess.run(
        [
            "c++",
            "-std=c++17",
            "-O1",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            f"-I{ROOT}/hvdlite_core/include",
            f"-I{ROOT}/hvdlite_core/src",
            SOURCE,
            "-o",
            str(library),
            "-static-libstdc++",
            *link_args,
        ],
        check=True,
        cwd=ROOT,  # setup.py's paths are relative to the checkout, as pip runs it
    )
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", "-C", str(library)], check=True, capture_output=True, text=True
    ).stdout
    # libstdc++'s own machinery (templates our code instantiates from headers are ours, and harmless).
    markers = ("std::locale", "std::ios_base", "std::basic_ios<")
    return sum(any(m in line for m in markers) for line in symbols.splitlines())


def test_a_static_libstdcxx_stays_inside_the_core(tmp_path):
    assert exported_libstdcxx_symbols(tmp_path, []) > 20  # the check sees the problem where it exists
    assert exported_libstdcxx_symbols(tmp_path, core_link_args()) == 0
