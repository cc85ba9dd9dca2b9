#!/bin/bash
# Catches the machine's slow periods (docs/benchmarks.md, "allreduce algorithms chosen from a measurement"):
# every few seconds, a 2-rank hvdlite job times 2 MB ring allreduces for 1 s (slow_mode_job.py), between two
# runs of a framework-free ping-pong of 2 MB through shared memory (pingpong.py). Run from the repository root:
#   bash bench/probes/slow_mode_logger.sh [ITERATIONS] > log.txt
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
for i in $(seq 1 "${1:-30}"); do
  pp=$($PY bench/probes/pingpong.py | grep -o "[0-9]* us")
  ring=$(HVDLITE_ALLREDUCE_ALGORITHMS=fixed .venv/bin/hvdlite-run -np 2 $PY bench/probes/slow_mode_job.py 2>/dev/null |
         grep -o "R0 [0-9.]*")
  pp2=$($PY bench/probes/pingpong.py | grep -o "[0-9]* us")
  echo "$(date +%T) pingpong2MB=$pp hvdlite_ring2MB=$ring pingpong2MB=$pp2"
  sleep 5
done
