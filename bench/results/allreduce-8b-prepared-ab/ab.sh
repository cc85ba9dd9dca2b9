#!/bin/bash
# alternates the 471d581 build (/tmp/ciX) and the working tree (/work/main) at 8 B; both runs include Open MPI
T=$1; TAG=$2
for i in $(seq 1 $T); do
  (cd /tmp/ciX && .venv/bin/python bench/allreduce.py --peers hvdlite,mpi --rounds 1 --sizes 8 --out-dir ${OUT:-/tmp/abpy}/$TAG-old-$i >/dev/null 2>&1)
  (cd /work/main && .venv/bin/python bench/allreduce.py --peers hvdlite,mpi --rounds 1 --sizes 8 --out-dir ${OUT:-/tmp/abpy}/$TAG-new-$i >/dev/null 2>&1)
done
python3 - "$TAG" "$T" <<'PY'
import json,sys,statistics
tag,T=sys.argv[1],int(sys.argv[2])
d={}
for v in ("old","new"):
    for i in range(1,T+1):
        j=json.load(open(f"/tmp/abpy/{tag}-{v}-{i}/allreduce.json"))
        for peer,run in j.items():
            if not isinstance(run, dict) or "results" not in run: continue
            k=("mpi-"+v) if peer=="mpi" else v
            d.setdefault(k,[]).append(run["results"][0]["median_s"]*1e6)
for k,v in d.items(): print(k, "median %.2f worst %.2f" % (statistics.median(v), max(v)), " ".join("%.2f"%x for x in v))
PY
