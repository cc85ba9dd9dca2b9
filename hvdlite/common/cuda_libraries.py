"""Where the CUDA runtime and NCCL come from when they were installed as pip wheels.

The core loads both with dlopen at run time (hvdlite_core/src/gpu/cuda_api.h) by the names the dynamic linker
knows (libcudart.so.12, libnccl.so.2). A process that imported a CUDA build of torch has them loaded already and
the names resolve; a process that has not (hvdlite's own --check-build, a TensorFlow job) needs the path of the
wheels' copies (nvidia-cuda-runtime-cu12, nvidia-nccl-cu12), which live in site-packages/nvidia/*/lib and are not
on the library path. This module finds them and passes them on through HVDLITE_CUDART_LIBRARY and
HVDLITE_NCCL_LIBRARY, unless the user set those.
"""

import os
import sys

_WHEEL_LIBRARIES = {
    "HVDLITE_CUDART_LIBRARY": (
        ("cuda_runtime", "lib", "libcudart.so.12"),
        ("cuda_runtime", "lib", "libcudart.so.13"),
        ("cu13", "lib", "libcudart.so.13"),  # CUDA 13's wheels share one folder
    ),
    "HVDLITE_NCCL_LIBRARY": (("nccl", "lib", "libnccl.so.2"), ("cu13", "lib", "libnccl.so.2")),
}


def wheel_library_paths() -> dict:
    """{variable: path} for each library a pip wheel under an entry of sys.path provides."""
    found = {}
    for variable, candidates in _WHEEL_LIBRARIES.items():
        for entry in sys.path:
            if not entry or not os.path.isdir(os.path.join(entry, "nvidia")):
                continue
            for parts in candidates:
                path = os.path.join(entry, "nvidia", *parts)
                if os.path.isfile(path):
                    found[variable] = path
                    break
            if variable in found:
                break
    return found


def export_wheel_libraries() -> None:
    for variable, path in wheel_library_paths().items():
        if not os.environ.get(variable) and not os.environ.get(variable.replace("HVDLITE_", "HOROVOD_")):
            os.environ[variable] = path
