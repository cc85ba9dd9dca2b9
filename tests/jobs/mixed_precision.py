"""torch.amp.GradScaler with hvdlite's DistributedOptimizer against one process on the global batch, under bf16 and
fp16 autocast, in three patterns: the plain one (scaler.scale(loss).backward(); scaler.step(opt); update()),
the plain one with unscale_ and gradient clipping, and Horovod's (synchronize(), unscale_, clip, step() inside
skip_synchronize()). At one step the last rank's loss overflows (times inf): every rank must skip that step, as the
one process does, whose global loss holds that rank's part. argv[1]: 1 to reduce during backward, 0 in step()."""

import sys

import torch
import torch.nn as nn

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
during_backward = sys.argv[1] == "1"
OVERFLOW_STEP, STEPS, CLIP = 2, 5, 0.2
# Within float tolerance of the one process, far below a step's change: the autocast dtype's rounding of activations
# amplifies the different order of the ranks' sums (at 2 ranks the weights come out equal).
TOLERANCE = {torch.bfloat16: 5e-4, torch.float16: 1e-4}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def shard_loss(net, step, r, dtype):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
    with torch.autocast("cpu", dtype=dtype):
        loss = (net(x).float() - y).pow(2).mean()
    return loss * float("inf") if step == OVERFLOW_STEP and r == size - 1 else loss


def flat(net):
    return torch.cat([p.detach().flatten() for p in net.parameters()])


for dtype in (torch.bfloat16, torch.float16):
    for pattern in ("plain", "clip", "horovod"):
        what = f"{pattern}/{dtype}"
        net, ref = model(), model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
            named_parameters=net.named_parameters(),
            reduce_during_backward=during_backward,
        )
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        scaler, ref_scaler = (
            torch.amp.GradScaler("cpu", init_scale=2.0**12),
            torch.amp.GradScaler("cpu", init_scale=2.0**12),
        )
        for step in range(STEPS):
            before = flat(net)
            opt.zero_grad()
            scaler.scale(shard_loss(net, step, rank, dtype)).backward()
            if pattern == "plain":
                scaler.step(opt)
            elif pattern == "clip":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
                scaler.step(opt)
            else:
                opt.synchronize()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
                with opt.skip_synchronize():
                    scaler.step(opt)
            scaler.update()

            ref_opt.zero_grad()
            ref_loss = sum(shard_loss(ref, step, r, dtype) for r in range(size)) / size
            ref_scaler.scale(ref_loss).backward()
            if pattern != "plain":
                ref_scaler.unscale_(ref_opt)
                torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
            ref_scaler.step(ref_opt)
            ref_scaler.update()

            skipped = torch.equal(flat(net), before)
            assert skipped == (step == OVERFLOW_STEP), f"{what} step {step}: skipped={skipped} on rank {rank}"
            assert scaler.get_scale() == ref_scaler.get_scale(), (
                what,
                step,
                scaler.get_scale(),
                ref_scaler.get_scale(),
            )
            assert torch.isfinite(flat(net)).all(), (what, step)
            assert torch.allclose(flat(net), flat(ref), rtol=0, atol=TOLERANCE[dtype]), (
                what,
                step,
                (flat(net) - flat(ref)).abs().max(),
            )
        everyone = hvd.allgather(flat(net).unsqueeze(0), name=f"weights.{what}")
        assert all(torch.equal(w, everyone[0]) for w in everyone), f"{what}: the ranks' weights differ"
        assert hvd.allgather_object(scaler.get_scale(), name=f"scale.{what}") == [scaler.get_scale()] * size
