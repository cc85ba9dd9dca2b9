#!/bin/bash
# Catches the machine's slow periods (docs/benchmarks.md, "allreduce algorithms chosen from a measurement"):
# every few seconds, whether two busy processes get two cores' worth of time (two_cores.py), a 2-rank hvdlite
# job timing 1500 2 MB ring allreduces (slow_mode_job.py), and a framework-free ping-pong of 2 MB through
# shared memory (pingpong.py). Run from the repository root:
#   bash bench/probes/slow_mode_logger.sh [ITERATIONS] > log.txt
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
for i in $(seq 1 "${1:-30}"); do
  cores=$($PY bench/probes/two_cores.py)
  ring=$(HVDLITE_ALLREDUCE_ALGORITHMS=fixed .venv/bin/hvdlite-run -np 2 $PY bench/probes/slow_mode_job.py 2>/dev/null |
         grep -o "R0 .*")
  pp=$($PY bench/probes/pingpong.py | grep -o "[0-9]* us")
  echo "$(date +%T) $cores hvdlite_ring2MB=$ring pingpong2MB=$pp"
  sleep 3
done
