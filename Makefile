# One entry point for people and CI. Each target sets up what it needs (a virtualenv in .venv, the compiled core)
# and then runs. Versions come from constraints.txt.
#   make train   - set up the core and PyTorch, then train the example on 2 processes
#   make test    - set up everything the tests need (every framework, the system packages), then run the suite
#   make bench   - the same set-up as the tests, then the benchmark scripts' smoke runs and the benchmarks
#   make wheel   - the sdist and manylinux wheels (x86_64, aarch64) in dist/, checked as PyPI's tools check them
#   make format  - apply the code style the tests check
# python3.11 where it exists (the supported version), else the python3 on PATH.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install -c constraints.txt
FAST_CALLS_SOURCES := $(wildcard hvdlite/common/*.c hvdlite/common/*.h)
CORE_SOURCES := $(shell find hvdlite_core -name '*.cc' -o -name '*.h' -o -name '*.map') $(FAST_CALLS_SOURCES)
INSTALL_INPUTS := setup.py pyproject.toml constraints.txt

.PHONY: setup system-packages build test train bench wheel sanitize format clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	touch $@

# pip install -e compiles the core into the source tree, so each set-up also marks it built: a fresh clone
# compiles once, not twice (about 50 s on 2 cores).
# The training example's needs only: the core, PyTorch and tqdm.
$(VENV)/.installed-train: $(VENV)/.created $(INSTALL_INPUTS)
	$(PIP_INSTALL) -e ".[torch,examples]"
	touch $@ $(VENV)/.core-built

# Everything the suite and the benchmarks use (the dev extra).
$(VENV)/.installed-dev: $(VENV)/.created $(INSTALL_INPUTS)
	$(PIP_INSTALL) -e ".[dev]"
	touch $@ $(VENV)/.installed-train $(VENV)/.installed-wheel $(VENV)/.core-built

# The release tools only: Zig's toolchain, build, auditwheel, twine.
$(VENV)/.installed-wheel: $(VENV)/.created $(INSTALL_INPUTS)
	$(PIP_INSTALL) -e ".[wheel]"
	touch $@ $(VENV)/.core-built

setup: $(VENV)/.installed-dev

# Rebuilds the core in place when a source or setup.py (its flags) changed since it was last built. The test is the shell's, not
# make's: make decided before the set-up ran that the stamp did not exist yet.
$(VENV)/.core-built: $(CORE_SOURCES) setup.py
	test -f $@ && test -z "$$(find hvdlite_core $(FAST_CALLS_SOURCES) setup.py -newer $@ -print -quit)" || $(PY) setup.py -q build_ext --inplace
	touch $@

# Every rank of every job imports the package afresh: bytecode compiled once here spares each of them compiling
# it again, also where PYTHONDONTWRITEBYTECODE keeps Python from caching it on its own.
build: $(VENV)/.created
	$(MAKE) --no-print-directory $(VENV)/.core-built
	$(PY) -m compileall -q hvdlite launcher tests

# System packages first: without root it stops in seconds with the command to run, before the long set-up.
system-packages:
	tools/system-packages.sh

# The suite's two lanes side by side (tests/conftest.py), then the tests that need the machine alone. Both runs
# always run; make fails if either failed or found no test.
test: system-packages
	$(MAKE) --no-print-directory $(VENV)/.installed-dev build
	status=0; \
	$(PY) -m pytest -q -ra --durations=25 -n 2 -m "not bench and not alone" || status=$$?; \
	$(PY) -m pytest -q -ra --durations=5 -m "alone" || status=$$?; \
	exit $$status

wheel:
	$(MAKE) --no-print-directory $(VENV)/.installed-wheel
	$(PY) tools/build_wheels.py --outdir dist

train:
	$(MAKE) --no-print-directory $(VENV)/.installed-train build
	$(PY) examples/make_mnist_idx.py --out data/mnist --train 6000 --test 1000
	$(VENV)/bin/hvdlite-run -np 2 $(PY) examples/pytorch_mnist.py --data-dir data/mnist --epochs 2

bench:
	$(MAKE) --no-print-directory $(VENV)/.installed-dev build
	$(PY) -m pytest -q -m bench tests/test_bench.py
	$(PY) bench/allreduce.py --rounds 5
	$(PY) bench/fixed_costs.py --rounds 5
	$(PY) bench/torch_features.py --rounds 5
	$(PY) bench/hierarchical.py
	$(PY) bench/hierarchical.py --collective allgather
	$(PY) bench/train.py --autotune
	$(PY) bench/step_timeline.py
	$(PY) bench/keras_train.py
	$(PY) bench/page.py

# The core's suites on AddressSanitizer+UBSan and ThreadSanitizer builds (not in CI: about 12 min each on 2 cores;
# docs/faults.md).
sanitize:
	$(MAKE) --no-print-directory $(VENV)/.installed-dev build
	tools/sanitize.sh address
	tools/sanitize.sh thread

# Applies the style tests/test_style.py checks: ruff (pyproject.toml) on the Python sources, clang-format
# (.clang-format) on the C and C++ ones.
format:
	$(MAKE) --no-print-directory $(VENV)/.installed-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
	git ls-files -z -- '*.cc' '*.h' '*.c' | xargs -0 $(VENV)/bin/clang-format -i

clean:
	rm -rf build $(VENV) hvdlite/_hvdlite_core*.so hvdlite/hvdlite.h *.egg-info
