"""Where each rank's main thread runs, window by window, while it allreduces 1 MB through hvdlite.torch: after a
few warm-up operations, --windows windows of --per-window named allreduces; for each window, the median time (us)
and the CPUs the thread was seen on (/proc/thread-self/stat, read every few operations).

    hvdlite-run -np 2 python bench/probes/rank_cpus_over_time.py [--place none|hint|bind]

--place hint moves each rank's main thread to the CPU of its local rank right after init, then allows every CPU
again; --place bind keeps it there for the whole job. Rank r prints "r <median>/<cpus> ..." for its windows. Two
ranks seen on the same CPU in a slow window show the guest's scheduler running both on one vCPU; a slow window with
the ranks bound apart points at the host (docs/benchmarks.md, "eager small allreduces").
"""
import argparse
import os
import statistics
import time

import torch

import hvdlite.torch as hvd


def current_cpu() -> str:
    with open("/proc/thread-self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[36]  # field 39, "processor"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--place", choices=("none", "hint", "bind"), default="none")
    parser.add_argument("--windows", type=int, default=30)
    parser.add_argument("--per-window", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    hvd.init()
    if args.place != "none":
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {allowed[hvd.local_rank() % len(allowed)]})  # this thread only
        if args.place == "hint":
            os.sched_setaffinity(0, set(allowed))
    t = torch.ones(262144)
    for _ in range(args.warmup):
        hvd.allreduce_(t, name="probe.1mb", op=hvd.Sum)
    every = max(1, args.per_window // 4)
    windows = []
    for _ in range(args.windows):
        times, cpus = [], set()
        for i in range(args.per_window):
            start = time.perf_counter()
            hvd.allreduce_(t, name="probe.1mb", op=hvd.Sum)
            times.append(time.perf_counter() - start)
            if i % every == 0:
                cpus.add(current_cpu())
        windows.append("%.0f/%s" % (statistics.median(times) * 1e6, ",".join(sorted(cpus))))
    print(hvd.rank(), " ".join(windows), flush=True)


if __name__ == "__main__":
    main()
