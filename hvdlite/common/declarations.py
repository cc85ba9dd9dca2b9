"""The C declarations cffi binds, read from hvdlite.h itself, so that the header stays the single source of truth:
used by the binding at run time and by setup.py, which loads this file by path before the package is built, so it
imports nothing of hvdlite."""

import re


def declarations(header_path: str) -> str:
    """hvdlite.h without its preprocessor lines and C++ guards: what cffi's cdef accepts."""
    with open(header_path) as f:
        text = f.read()
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
