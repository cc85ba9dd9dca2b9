"""Sixty steps of forty gradients in flight each, every result checked, while the autotuner searches: it ends
('done') having searched, and every rank holds the same tuned fusion threshold and cycle time."""

import torch
from hvdjob import check, make, parse_build_info, reduce_reference

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
count = 0
states = set()
for step in range(60):
    # Like a backward pass: many gradients in flight at once, fused or not depending on the threshold in use.
    shapes = [(1000 + 7 * i,) for i in range(40)]
    inputs = [make(me, ("grad", step % 5, i), s, torch.float32) for i, s in enumerate(shapes)]
    handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"grad.{i}") for i, t in enumerate(inputs)]
    for i, h in enumerate(handles):
        expected = reduce_reference(
            [make(r, ("grad", step % 5, i), shapes[i], torch.float32) for r in range(n)], "Sum", torch.float32
        )
        check(f"step {step} tensor {i}", hvd.synchronize(h), expected, exact=False)
        count += 1
    info = parse_build_info(hvd.build_info())
    states.add(info["autotune"])
info = parse_build_info(hvd.build_info())
assert info["autotune"] == "done", info["autotune"]
assert "searching" in states, states
mine = torch.tensor([float(info["tuned_fusion_threshold"]), float(info["tuned_cycle_time_ms"])], dtype=torch.float64)
everyone = hvd.allgather(mine.reshape(1, 2), name="tuned")
assert all(torch.equal(everyone[0], everyone[r]) for r in range(n)), everyone
assert count == 60 * 40, count
