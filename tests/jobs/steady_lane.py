# Job script: the steady lane (hvdlite_core/src/runtime/steady_lane.cc), which runs a synchronous allreduce of a
# cached small tensor as one exchange on the caller's thread. Every way out of it must give the right result: the
# lane finishing the operation, the lane handing it to a cycle because another rank's cycle also brought new
# requests (the operation is adopted as a pending entry), and a mismatch found while one rank is in the lane (an
# error on every rank, and the name usable afterwards), the lane beside unnamed operations in the cache, whose
# positions every exchange then votes on too, and unnamed operations in the lane themselves. argv: ROUNDS.
import sys

import torch
from hvdjob import check, expect_raises, make, parse_build_info, prefill_cache

import hvdlite.torch as hvd

hvd.init()
prefill_cache(hvd)
n, me = hvd.size(), hvd.rank()
rounds = int(sys.argv[1])
count = 0


def lane_counts():
    """(operations the lane finished, operations it handed to a cycle) on this rank so far."""
    info = parse_build_info(hvd.build_info())
    return int(info["steady_lane_runs"]), int(info["steady_lane_adopted"])


def expected(key, shape, op=hvd.Sum, pre=1.0, post=1.0):
    inputs = torch.stack([make(r, key, shape, torch.float32) for r in range(n)])
    if op == hvd.Min:
        return inputs.min(dim=0).values
    if op == hvd.Max:
        return inputs.max(dim=0).values
    return inputs.sum(dim=0) * pre * post / (n if op == hvd.Average else 1)


# Warm-up: the first call of a name is negotiated and cached; the lane takes the ones after it. A 1 KB tensor
# rides in the eager region's tail, which an exchange carries only when every rank has data there
# (runtime/vote_exchange.h); the 8-byte ones in its head.
t = torch.zeros(2)
kb = torch.zeros(256)
for step in range(3):
    t.copy_(make(me, ("warm", step), (2,), torch.float32))
    hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
    check(f"warm-up {step}", t, expected(("warm", step), (2,)))
    kb.copy_(make(me, ("warm kb", step), (256,), torch.float32))
    hvd.allreduce_(kb, name="lane.kb", op=hvd.Sum)
    check(f"warm-up 1 KB {step}", kb, expected(("warm kb", step), (256,)), exact=False)
    count += 2

# Steady state, in place and into a new tensor, with every element-wise op and scale factors.
runs_before, _ = lane_counts()
cases = [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Min, 1.0, 1.0), (hvd.Max, 1.0, 1.0), (hvd.Sum, 2.0, 0.5)]
calls = 0
for step in range(rounds):
    for i, (op, pre, post) in enumerate(cases):
        key = ("steady", step, i)
        t.copy_(make(me, key, (2,), torch.float32))
        hvd.allreduce_(t, name=f"lane.{i}", op=op, prescale_factor=pre, postscale_factor=post)
        check(
            f"in place, op {op} pre {pre} post {post} step {step}", t, expected(key, (2,), op, pre, post), exact=False
        )
        out = hvd.allreduce(make(me, key, (2,), torch.float32), name=f"lane.new.{i}", op=op)
        check(f"into a new tensor, op {op} step {step}", out, expected(key, (2,), op), exact=False)
        kb.copy_(make(me, key, (256,), torch.float32))
        hvd.allreduce_(kb, name=f"lane.kb.{i}", op=op, prescale_factor=pre, postscale_factor=post)
        check(
            f"1 KB, op {op} pre {pre} post {post} step {step}", kb, expected(key, (256,), op, pre, post), exact=False
        )
        calls += 3
        count += 3
runs_after, _ = lane_counts()
# The ranks arrive at slightly different moments: a call whose exchange meets a peer's idle cycle goes the usual way.
# Most must take the lane, or it is not the steady state's path.
if runs_after - runs_before < calls // 4:
    raise AssertionError(f"the lane finished {runs_after - runs_before} of {calls} steady-state calls")
count += 1

# Another rank's cycle brings new requests while this rank is in the lane: rank 0 is in the lane for a cached name
# (every other step the 1 KB one in the tail) while the others' cycle carries it and a new name of theirs; rank 0
# submits the new name afterwards.
for step in range(rounds):
    fresh = torch.full((3,), float(me + step))
    cached, shape = (t, (2,)) if step % 2 == 0 else (kb, (256,))
    cached.copy_(make(me, ("adopt", step), shape, torch.float32))
    cached_name = "lane.sum" if step % 2 == 0 else "lane.kb"
    if me == 0:
        hvd.allreduce_(cached, name=cached_name, op=hvd.Sum)
        handle = hvd.allreduce_async_(fresh, name=f"lane.fresh.{step}", op=hvd.Sum)
    else:
        handle = hvd.allreduce_async_(fresh, name=f"lane.fresh.{step}", op=hvd.Sum)
        hvd.allreduce_(cached, name=cached_name, op=hvd.Sum)
    hvd.synchronize(handle)
    # (the 1 KB sum's order of additions may differ from the reference's at 3 ranks)
    check(
        f"cached one beside new requests, step {step}", cached, expected(("adopt", step), shape), exact=shape == (2,)
    )
    check(f"the new one, step {step}", fresh, torch.full((3,), float(sum(range(n)) + n * step)))
    count += 2
_, adopted = lane_counts()
if me == 0 and adopted == 0:
    raise AssertionError(f"in {rounds} rounds the lane never handed its operation to a cycle")
count += 1

# A mismatch met in the lane: rank 0 calls with the cached shape (and takes the lane), the others with another.
for step in range(3):
    shape = (2,) if me == 0 else (3,)
    u = torch.ones(shape)
    expect_raises(
        f"shapes that differ under one cached name, step {step}",
        Exception,
        hvd.allreduce_,
        u,
        name="lane.sum",
        op=hvd.Sum,
        match=["lane.sum", "shape"],
    )
    count += 1
    # Still usable, under the same name.
    t.copy_(make(me, ("after", step), (2,), torch.float32))
    hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
    check(f"after the mismatch, step {step}", t, expected(("after", step), (2,)))
    count += 1

# An unnamed allreduce cached beside them: every exchange then carries a vote on unnamed positions too, which the
# lane casts as a cycle with no unnamed hit would. Rank 0 is in the lane while the others' cycles (something else
# of theirs is queued) carry that vote; and, at some steps, another rank's cycle holds the unnamed one while rank 0
# is in the lane for a named one.
side = torch.zeros(2)
for step in range(rounds):
    key = ("unnamed", step)
    out = hvd.allreduce(make(me, key, (2,), torch.float32), op=hvd.Sum)
    check(f"unnamed, step {step}", out, expected(key, (2,)))
    t.copy_(make(me, ("beside unnamed", step), (2,), torch.float32))
    side.fill_(me)
    if me == 0:
        hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
        handle = hvd.allreduce_async_(side, name="lane.side", op=hvd.Sum)
    else:
        handle = hvd.allreduce_async_(side, name="lane.side", op=hvd.Sum)
        hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
    hvd.synchronize(handle)
    check(f"named beside an unnamed one, step {step}", t, expected(("beside unnamed", step), (2,)))
    check(f"the other ranks' queued one, step {step}", side, torch.full((2,), float(sum(range(n)))))
    if step % 4 == 1:  # the unnamed one submitted by the others first: rank 0's lane meets their unnamed hit
        key = ("unnamed first", step)
        if me == 0:
            t.copy_(make(me, key, (2,), torch.float32))
            hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
            out = hvd.allreduce(make(me, ("unnamed second", step), (2,), torch.float32), op=hvd.Sum)
        else:
            handle = hvd.allreduce_async(make(me, ("unnamed second", step), (2,), torch.float32), op=hvd.Sum)
            t.copy_(make(me, key, (2,), torch.float32))
            hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
            out = hvd.synchronize(handle)
        check(f"named while another rank's unnamed one waits, step {step}", t, expected(key, (2,)))
        check(f"that unnamed one, step {step}", out, expected(("unnamed second", step), (2,)))
        count += 2
    count += 3

# With the unnamed one still cached, the steady state of named ones takes the lane as before.
runs_before, _ = lane_counts()
for step in range(rounds):
    key = ("steady beside unnamed", step)
    t.copy_(make(me, key, (2,), torch.float32))
    hvd.allreduce_(t, name="lane.sum", op=hvd.Sum)
    check(f"steady beside a cached unnamed one, step {step}", t, expected(key, (2,)))
    count += 1
runs_after, _ = lane_counts()
if runs_after - runs_before < rounds // 4:
    raise AssertionError(
        f"with an unnamed operation cached, the lane finished {runs_after - runs_before} of {rounds}"
    )
count += 1

# Unnamed allreduces in the lane: each is found by what it carries among the cached unnamed ones (several here, of
# one class) and votes as this rank's only unnamed hit.
forms = [((2,), hvd.Sum), ((2,), hvd.Max), ((5,), hvd.Sum)]
for warm in range(2):
    for shape, op in forms:
        hvd.allreduce_(torch.ones(shape), op=op)
runs_before, _ = lane_counts()
for step in range(rounds):
    for i, (shape, op) in enumerate(forms):
        key = ("unnamed steady", step, i)
        u = make(me, key, shape, torch.float32)
        hvd.allreduce_(u, op=op)
        check(f"unnamed in the lane, {shape} {op}, step {step}", u, expected(key, shape, op))
        count += 1
runs_after, _ = lane_counts()
if runs_after - runs_before < len(forms) * rounds // 4:
    raise AssertionError(
        f"the lane finished {runs_after - runs_before} of {len(forms) * rounds} steady unnamed calls"
    )
count += 1

# Rank 0 meets in the lane an unnamed one that the others' cycles hold as a hit; now and then an unnamed one of a
# shape never seen follows, which every rank sends to the coordinator under its number: one finished in the lane
# must have taken its number too, or the ranks' numbers differ and it never matches.
for step in range(rounds):
    key = ("unnamed held", step)
    u = make(me, key, (2,), torch.float32)
    if me == 0:
        hvd.allreduce_(u, op=hvd.Sum)
    else:
        hvd.synchronize(hvd.allreduce_async_(u, op=hvd.Sum))
    check(f"unnamed held by the others, step {step}", u, expected(key, (2,)))
    count += 1
    if step % 8 == 7:
        key = ("unnamed new", step)
        fresh = make(me, key, (6 + step,), torch.float32)
        hvd.allreduce_(fresh, op=hvd.Sum)
        check(f"a new unnamed one after the lane's, step {step}", fresh, expected(key, (6 + step,)))
        count += 1

# Another rank's cycle brings a new request while rank 0's unnamed one is in the lane: it is adopted, waits as the
# unnamed hit it voted, and finishes in a cycle.
_, adopted_before = lane_counts()
for step in range(rounds):
    key = ("unnamed adopted", step)
    u = make(me, key, (2,), torch.float32)
    fresh = torch.full((3,), float(me + step))
    if me == 0:
        hvd.allreduce_(u, op=hvd.Sum)
        handle = hvd.allreduce_async_(fresh, name=f"lane.unnamed.fresh.{step}", op=hvd.Sum)
    else:
        handle = hvd.allreduce_async_(fresh, name=f"lane.unnamed.fresh.{step}", op=hvd.Sum)
        hvd.allreduce_(u, op=hvd.Sum)
    hvd.synchronize(handle)
    check(f"unnamed one beside a new request, step {step}", u, expected(key, (2,)))
    check(f"the new one beside it, step {step}", fresh, torch.full((3,), float(sum(range(n)) + n * step)))
    count += 2
_, adopted = lane_counts()
if me == 0 and adopted == adopted_before:
    raise AssertionError(f"in {rounds} rounds the lane never handed an unnamed operation to a cycle")
count += 1

# A mismatch met in the lane: rank 0's unnamed one and the others' are both cached, at different positions of one
# class. The coordinator names what differs, on every rank, and unnamed calls work afterwards.
for step in range(3):
    shape = (2,) if me == 0 else (5,)
    expect_raises(
        f"unnamed shapes that differ, met in the lane, step {step}",
        Exception,
        hvd.allreduce_,
        torch.ones(shape),
        op=hvd.Sum,
        match=["allreduce.noname.", "shape"],
    )
    key = ("unnamed after", step)
    u = make(me, key, (2,), torch.float32)
    hvd.allreduce_(u, op=hvd.Sum)
    check(f"unnamed after the mismatch, step {step}", u, expected(key, (2,)))
    count += 2

print(f"OK {count} lane {lane_counts()}", flush=True)
hvd.shutdown()
