"""Draws blocks.json (bench/probes/algorithms_vs_placement.py): ring / single-copy time per block and size,
against the block's vCPU placement. Run from this folder: python plot_blocks.py -> blocks.png"""
import json

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

data = json.load(open("blocks.json"))
fig, ax = plt.subplots(figsize=(9, 4.5))
for n, marker in zip(data["sizes"], "os^Dv"):
    xs, ys = [], []
    for block in data["blocks"]:
        xs.append(max(block["placement_ns"]))
        ys.append(block["us"]["ring"][str(n)] / block["us"]["single_copy"][str(n)])
    ax.scatter(xs, ys, marker=marker, label=f"{n >> 10} KB", alpha=0.7)
ax.axhline(1.0, color="gray", lw=1)
ax.set_xscale("log")
ax.set_xlabel("cache-line round trip between the two vCPUs, ns (the slower of the probes before and after)")
ax.set_ylabel("ring time / single-copy time\n(above 1: single copy faster)")
ax.set_title("Ring against single copy by vCPU placement, 60 blocks, AMD EPYC 2 vCPUs, 2026-11-25")
ax.legend(title="allreduce size")
fig.tight_layout()
fig.savefig("blocks.png", dpi=110)
