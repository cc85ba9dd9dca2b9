#!/usr/bin/env bash
# The checks that need a real GPU, in one run on a GPU machine: builds and installs hvdlite there, reports the
# machine, runs tests/test_gpu.py (CUDA tensors on NCCL at one rank, two ranks sharing the GPU through the
# host-staged path, forced NCCL refused on every rank, training against a one-process reference,
# --check-build) and bench/gpu_collectives.py (hvdlite against torch.distributed in the same run).
#
#   tools/gpu_check.sh [LOG_DIR]      # default: $OUT where set, else /tmp/gpu_check
#
# Python packages the machine lacks travel as wheels in .whl/ (cffi, pycparser: nothing can be fetched there); the
# project's own venv is not used. Logs: LOG_DIR/gpu_check.log, gpu_tests.xml, gpu_collectives.json.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$LOG_DIR"
exec > >(tee "$LOG_DIR/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 HVDLITE_BUILD_JOBS=${HVDLITE_BUILD_JOBS:-$(nproc)}
PY=${PYTHON:-python3}
status=0
section() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

section machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c "import sys, torch; print('Python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA',
torch.version.cuda, '| NCCL', '.'.join(map(str, torch.cuda.nccl.version())), '|', torch.cuda.device_count(),
'GPU(s)')"
c++ --version | head -1
"$PY" -c "import glob, os, sys; print('CUDA libraries on sys.path:', sorted({p for e in sys.path if os.path.isdir(e)
for p in glob.glob(os.path.join(e, 'nvidia', '*', 'lib', 'lib[cn][uc][dc][al]*.so*'))}))"

section "wheels from .whl"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  ls .whl
fi

section "build and install hvdlite (editable, offline)"
started=$SECONDS
"$PY" setup.py -q build_ext --inplace || exit 1
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
echo "built and installed in $((SECONDS - started)) s"

# One CUDA allreduce in one process, under faulthandler: a crash here is the build's, and cuda-gdb (where the
# machine has it) shows where. GPU_CHECK_FALLBACK_CORE names a core built elsewhere to run the checks with then.
smoke() {
  "$PY" -X faulthandler -c "import torch, hvdlite.torch as hvd; hvd.init(); torch.cuda.set_device(0)
print('smoke:', hvd.allreduce(torch.ones(4, device='cuda'), op=hvd.Sum, name='smoke').tolist())"
}
section "smoke test of the build"
if ! smoke; then
  if command -v cuda-gdb >/dev/null; then
    timeout 120 cuda-gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" -X faulthandler -c \
      "import torch, hvdlite.torch as hvd; hvd.init(); torch.cuda.set_device(0)
hvd.allreduce(torch.ones(4, device='cuda'), op=hvd.Sum, name='smoke')" 2>&1 | grep -v "New Thread\|exited with"
  fi
  status=1
  if [ -n "${GPU_CHECK_FALLBACK_CORE:-}" ]; then
    echo "the build crashed: going on with $GPU_CHECK_FALLBACK_CORE"
    cp "$GPU_CHECK_FALLBACK_CORE" hvdlite/_hvdlite_core.so
    smoke || exit 1
  fi
fi

section "hvdlite-run --check-build"
"$PY" -m hvdlite.runner.launch --check-build || status=1

section "tests/test_gpu.py"
"$PY" -m pytest -v -s -rs -p no:cacheprovider tests/test_gpu.py --junitxml="$LOG_DIR/gpu_tests.xml" || status=1

section "bench/gpu_collectives.py"
"$PY" bench/gpu_collectives.py --out-dir "$LOG_DIR" || status=1

section TensorFlow
"$PY" -c "import tensorflow as tf; print('TensorFlow', tf.__version__, tf.config.list_physical_devices('GPU'))" ||
  echo "no TensorFlow on this machine: its GPU path stays untested"

section "done, exit $status"
exit $status
