"""How fast each CPU runs plain Python, window by window: one busy process pinned to each CPU counts fixed units of
work (a 1,000-step integer loop) per window, all CPUs at once, with no hvdlite and no communication.

    python bench/probes/cpu_speed.py --seconds 20 --window 0.5

A quiet machine gives flat rows. On the shared 2-vCPU AMD EPYC VM each CPU's rate dropped to 55-60% of its best in
some windows, the two CPUs independently (docs/benchmarks.md, "the machine's own speed"), while /proc/stat's steal
time stayed near zero: a 2-rank job then runs at the pace of whichever CPU is slow at the moment.
"""
import argparse
import multiprocessing as mp
import os
import statistics
import time


def count_units(cpu: int, seconds: float, window: float, out) -> None:
    os.sched_setaffinity(0, {cpu})
    rates = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        units, end = 0, time.perf_counter() + window
        while time.perf_counter() < end:
            total = 0
            for i in range(1000):
                total += i
            units += 1
        rates.append(units)
    out.put((cpu, rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=0.5, help="seconds per sample")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    queue = mp.Queue()
    workers = [mp.Process(target=count_units, args=(cpu, args.seconds, args.window, queue)) for cpu in cpus]
    for w in workers:
        w.start()
    results = dict(queue.get() for _ in workers)
    for w in workers:
        w.join()
    for cpu in cpus:
        rates = results[cpu]
        best = max(rates)
        print(f"cpu {cpu}: units per window min {min(rates)} median {statistics.median(rates):.0f} max {best}; "
              f"slowest window {min(rates) / best:.2f} of the fastest; windows under 0.8 of the fastest: "
              f"{sum(r < 0.8 * best for r in rates)} of {len(rates)}")
        print("  " + " ".join(str(r) for r in rates))
    if len(cpus) >= 2:
        a, b = results[cpus[0]], results[cpus[1]]
        n = min(len(a), len(b))
        if n > 2:
            print(f"correlation of cpu {cpus[0]} and cpu {cpus[1]} window by window: "
                  f"{statistics.correlation(a[:n], b[:n]):.2f}")


if __name__ == "__main__":
    main()
