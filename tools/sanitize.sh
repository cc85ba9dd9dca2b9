#!/usr/bin/env bash
# Builds the core under a sanitizer and runs the core's suites against that build: the C++ unit tests, then the
# multi-process suites (collectives, bad input, process sets, errors travelling, interrupts) with every rank
# loading the sanitized library. A sanitizer report fails the run (halt_on_error).
#
#   tools/sanitize.sh address   # AddressSanitizer + UndefinedBehaviorSanitizer
#   tools/sanitize.sh thread    # ThreadSanitizer
#   make sanitize               # both, one after the other
#   SANITIZE_TESTS="tests/test_errors.py" tools/sanitize.sh thread -x   # other suites, extra pytest options
#
# Python itself is not instrumented: the sanitizer runtime is preloaded (LD_PRELOAD) into every process and the
# core is loaded from HVDLITE_CORE_LIBRARY. Leak checking is off: the interpreter keeps memory until exit by
# design, which LeakSanitizer cannot tell from a leak (the soak test measures our growth instead).
set -euo pipefail
kind=${1:?usage: tools/sanitize.sh address|thread}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
cxx=${CXX:-g++}
py=${PYTHON:-$root/.venv/bin/python}
out=$root/build/sanitize/$kind
mkdir -p "$out"
case $kind in
  address) flags=(-fsanitize=address,undefined -fno-sanitize-recover=undefined) runtime=libasan.so
           export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:quarantine_size_mb=32:malloc_context_size=8
           export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ;;
  thread)  flags=(-fsanitize=thread) runtime=libtsan.so
           export TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:second_deadlock_stack=1:suppressions=$root/tools/tsan.supp"
           export OMP_NUM_THREADS=1 ;;  # no OpenMP team in torch: uninstrumented, it only produces noise
  *) echo "tools/sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 2 ;;
esac
sources=$(find "$root/hvdlite_core/src" -name '*.cc' | sort)
echo "== building the core with -fsanitize=$kind into $out"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -O1 -g -fno-omit-frame-pointer -fPIC -shared -pthread "${flags[@]}" \
  -I"$root/hvdlite_core/include" -I"$root/hvdlite_core/src" $sources -o "$out/libhvdlite_core.so" -lrt
echo "== C++ unit tests"
# The same files as tests/test_core_cpp.py builds them from (the lists live there).
unit_test_files() {
  local code="import sys; sys.path.insert(0, '$root/tests'); import test_core_cpp as t
print(' '.join(['$root/hvdlite_core/tests/' + f for f in t.TEST_SOURCES] + ['$root/hvdlite_core/src/' + s for s in t.SOURCES]))"
  "$root/.venv/bin/python" -c "$code" 2>/dev/null || python3 -c "$code"
}
# shellcheck disable=SC2046
"$cxx" -std=c++17 -O1 -g -pthread "${flags[@]}" -I"$root/hvdlite_core/include" -I"$root/hvdlite_core/src" \
  $(unit_test_files) -o "$out/unit_tests"
"$out/unit_tests"
echo "== multi-process suites on the $kind build"
export HVDLITE_CORE_LIBRARY=$out/libhvdlite_core.so
export EXPECT_BINDING=abi  # a core loaded from a path is bound through cffi, not the compiled binding
# libstdc++ too: python does not link it, and the sanitizer must find the real __cxa_throw when it starts
# (else "CHECK failed: ... real___cxa_throw" at the first C++ exception).
LD_PRELOAD="$("$cxx" -print-file-name=$runtime) $("$cxx" -print-file-name=libstdc++.so.6)"
export LD_PRELOAD
cd "$root"
# SANITIZE_TESTS replaces the list of suites.
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider -rA ${SANITIZE_TESTS:-tests/test_collectives.py tests/test_errors.py \
  tests/test_process_sets.py tests/test_error_travel.py tests/test_interrupts.py} "$@"
