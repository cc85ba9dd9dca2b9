"""Whether the machine's two vCPUs run at once right now: loop iterations in 0.3 s of one busy process alone,
then of two at the same time; prints the ratio (2.0: two cores' worth, 1.0: the two share one core's time)."""
import multiprocessing as mp
import time


def spin(seconds, out):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    out.put(n)


if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=spin, args=(0.3, q))
    p.start(); p.join()
    alone = q.get()
    ps = [mp.Process(target=spin, args=(0.3, q)) for _ in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    together = q.get() + q.get()
    print("two_busy_processes/one=%.2f" % (together / alone))
