# A/B of streaming stores (HVDLITE_STREAMING_STORE_BYTES default against 0), 2 ranks, the static table (ring at
# these sizes), turns alternated: python bench/results/streaming-stores/ab.py TURNS OUT.json
import json, os, subprocess, sys
res = {"off": [], "on": []}
for turn in range(int(sys.argv[1])):
    for label in (("off", "on") if turn % 2 == 0 else ("on", "off")):
        env = dict(os.environ, HVDLITE_ADAPTIVE_ALLREDUCE_BYTES="0")
        if label == "off":
            env["HVDLITE_STREAMING_STORE_BYTES"] = "0"
        p = subprocess.run([sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--", sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop.py")],
                           env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
        line = [l for l in p.stdout.splitlines() if "RESULT " in l]
        if not line: print(p.stdout[-2000:], p.stderr[-2000:]); continue
        r = json.loads(line[0].split("RESULT ", 1)[1]); res[label].append(r)
        print(turn, label, {k: round(v) for k, v in r.items()}, flush=True)
json.dump(res, open(sys.argv[2], "w"))
import statistics
for size in res["off"][0]:
    off = [r[size] for r in res["off"]]; on = [r[size] for r in res["on"]]
    wins = sum(b < a for a, b in zip(off, on))
    print(size, "off median", round(statistics.median(off)), "on median", round(statistics.median(on)),
          "speedup", round(statistics.median(off) / statistics.median(on), 3), "turns on faster", wins, "of", len(on))
