# One entry point for people and CI. Each target sets up what it needs (a virtualenv in .venv with the
# pinned extras from setup.py, the compiled core) and then runs.
#   make train   - set up, then train the example on 2 processes
#   make test    - set up, then run the test suite
#   make bench   - set up, then run the benchmarks
# python3.11 where it exists (the supported version), else the python3 on PATH.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
CORE_SOURCES := $(shell find hvdlite_core -name '*.cc' -o -name '*.h')

.PHONY: setup system-packages build test train bench sanitize clean

# pip install -e compiles the core into the source tree, so the set-up also marks it built: a fresh clone
# compiles once, not twice (about 50 s on 2 cores).
$(VENV)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install -e ".[dev]"
	touch $@
	touch $(VENV)/.core-built

setup: $(VENV)/.installed

# Rebuilds the core in place when a source changed since it was last built. The test is the shell's, not
# make's: make decided before the set-up ran that the stamp did not exist yet.
$(VENV)/.core-built: $(VENV)/.installed $(CORE_SOURCES)
	test -f $@ && test -z "$$(find hvdlite_core -newer $@ -print -quit)" || $(PY) setup.py -q build_ext --inplace
	touch $@

build: $(VENV)/.core-built

# System packages first: without root it stops in seconds with the command to run, before the long set-up.
system-packages:
	tools/system-packages.sh

test: system-packages
	$(MAKE) --no-print-directory build
	$(PY) -m pytest -q -ra --durations=25

train: build
	$(PY) examples/make_mnist_idx.py --out data/mnist --train 6000 --test 1000
	$(VENV)/bin/hvdlite-run -np 2 $(PY) examples/pytorch_mnist.py --data-dir data/mnist --epochs 2

bench: build
	$(PY) bench/allreduce.py --rounds 5
	$(PY) bench/hierarchical.py
	$(PY) bench/hierarchical.py --collective allgather
	$(PY) bench/train.py --autotune
	$(PY) bench/step_timeline.py
	$(PY) bench/keras_train.py

# The core's suites on AddressSanitizer+UBSan and ThreadSanitizer builds (not in CI: about 12 min each on 2 cores;
# docs/faults.md).
sanitize: build
	tools/sanitize.sh address
	tools/sanitize.sh thread

clean:
	rm -rf build $(VENV) hvdlite/_hvdlite_core*.so hvdlite/hvdlite.h *.egg-info
