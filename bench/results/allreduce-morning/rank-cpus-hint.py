import os, sys, time, statistics, torch, hvdlite.torch as hvd
hvd.init()
if sys.argv[1] in ("hint", "pin"):
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[hvd.local_rank() % len(allowed)]})
    if sys.argv[1] == "hint": os.sched_setaffinity(0, set(allowed))
def cpu():
    with open("/proc/thread-self/stat") as f: return f.read().rsplit(")",1)[1].split()[36]
t = torch.ones(262144)
for _ in range(5): hvd.allreduce_(t, name="m", op=hvd.Sum)
out=[]
for w in range(6):
    ts=[]; cpus=set()
    for i in range(30):
        s=time.perf_counter(); hvd.allreduce_(t, name="m", op=hvd.Sum); ts.append(time.perf_counter()-s)
        if i % 10 == 0: cpus.add(cpu())
    out.append("%.0f/%s" % (statistics.median(ts)*1e6, "".join(sorted(cpus))))
print(hvd.rank(), " ".join(out), flush=True)
