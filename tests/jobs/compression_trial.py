"""With min_step_speedup, a reducer times its last trial_steps uncompressed warm-up steps and the first
trial_steps compressed ones, and every rank takes the same decision from the ranks' average medians. The
trial's compressed steps time the compressed exchange but apply the exact average. Where the uncompressed
steps are slow (a sleep stands in for a slow link) it keeps compressing; where compressed steps are not that
much shorter it stops, and every gradient applied, in the trial too, is the true average. Where compressed steps
are far shorter, it decides for compression after two of them. Through
DistributedOptimizer, the steps a reducer does not compress are reduced the usual way (during backward where
the optimizer does that) and still counted, timed and recorded."""

import time

import torch
import torch.nn as nn
from compression_common import PowerSGDReducer, R, TopKReducer, fake_params, hvd, same_everywhere

START, T = 2, 4
LAST_PLAIN = max(START, T + 1)  # the warm-up is lengthened so that T uncompressed steps are timed (not the first)
for kind, speedup, slow_plain in (("powersgd", 1.5, True), ("powersgd", 50.0, False), ("topk", 50.0, False)):
    params, names = fake_params([(40, 30), (8, 4, 3, 3), (30,)])
    settings = dict(start_iter=START, min_step_speedup=speedup, trial_steps=T)
    if kind == "powersgd":
        reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, **settings)
    else:
        reducer = TopKReducer(names, hvd.global_process_set, hvd.Average, hvd, ratio=0.05, **settings)
    applied = [torch.zeros_like(p) for p in params]
    true_sum = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(100 + R)
    # Compressed steps far shorter than uncompressed ones end the trial at once, and compressed steps none of which
    # was much shorter from the second on (the first may carry one-time costs); otherwise it ends after T.
    decided = None
    for step in range(1, 15):
        # A step is timed from the end of the last one's reduction to the end of its own. The slow link is slow
        # enough that compressed steps slowed by other jobs on a busy machine still count as far shorter.
        if slow_plain and LAST_PLAIN - T < step <= LAST_PLAIN:
            time.sleep(0.5)
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        everyone = [hvd.allreduce(grad, name=f"true.{i}", op=hvd.Average) for i, grad in enumerate(grads)]
        in_trial = LAST_PLAIN < step and (decided is None or step <= decided)
        expected = in_trial or (decided is not None and step > decided and slow_plain)
        assert reducer.compresses_next() == expected, (kind, step)
        reducer.reduce(params)
        if step == LAST_PLAIN:  # the rehearsed compressed exchange of this step's gradients changed nothing
            assert reducer.trial.work_seconds > 0, (kind, reducer.trial.state())
            assert reducer.residuals == {} and not getattr(reducer, "qs", {}), kind
            for p, mean in zip(params, everyone):
                torch.testing.assert_close(p.grad, mean, rtol=1e-5, atol=1e-5)
        if decided is None and reducer.trial.decision is not None:
            decided = step
            when = (1, T - 1) if slow_plain else (2, T)  # compressed steps: yes from the first, no from the second
            assert when[0] <= step - LAST_PLAIN <= when[1], ("decided when", kind, step, reducer.trial.state())
        for a, t, p, mean in zip(applied, true_sum, params, everyone):
            a += p.grad
            t += mean
            if in_trial:
                torch.testing.assert_close(p.grad, mean, rtol=1e-5, atol=1e-5)
        if in_trial:
            assert reducer.residuals == {}, (kind, step)
        compressing = reducer.last_sent_elements * 2 <= reducer.last_dense_elements
        assert compressing == expected, (kind, step, reducer.trial.state())
        assert (reducer.trial.decision is None) == (decided is None or step < decided), (kind, step)
    assert reducer.trial.decision is slow_plain
    state = reducer.trial.state()
    assert same_everywhere(torch.tensor([state["plain_seconds"], state["compressed_seconds"]]), "trial medians")
    if slow_plain:
        assert state["plain_seconds"] >= 2 * 1.5 * state["compressed_seconds"], state
    else:
        assert reducer.residuals == {}, kind
        for a, t in zip(applied, true_sum):
            torch.testing.assert_close(a, t, rtol=1e-4, atol=1e-4)
    assert reducer.shared_state()["trial"] == state


# Through the optimizer. Its uncompressed steps go through the usual path (submitted during backward when asked
# to) and report how long each waited for its exchange. A sleep in the exchange on both ranks stands in for a slow
# link; a sleep in rank 1's compute, for a slower rank, which the other then waits for.
def through_optimizer(speedup, slow_link=(), slow_rank_1=()):  # the steps each sleeps in
    torch.manual_seed(0)
    net = nn.Linear(48, 32)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05),
        named_parameters=net.named_parameters(),
        compression=hvd.Compression.powersgd(rank=1, start_iter=1, min_step_speedup=speedup, trial_steps=2),
        reduce_during_backward=True,
    )
    finish, current, slept = opt._hvd_finish, [0], set()

    def finish_over_a_slow_link(p, pending):
        if current[0] in slow_link and current[0] not in slept:
            slept.add(current[0])
            time.sleep(0.3)
        return finish(p, pending)

    opt._hvd_finish = finish_over_a_slow_link
    reducer = opt.gradient_reducer
    modes = []
    for step in range(1, 9):
        current[0] = step
        modes.append(opt.reduces_during_backward)
        if R == 1 and step in slow_rank_1:
            time.sleep(0.3)
        opt.zero_grad()
        net(torch.randn(8, 48, generator=torch.Generator().manual_seed(R * 100 + step))).pow(2).mean().backward()
        opt.step()
        assert reducer.iteration == step
    assert same_everywhere(net.weight, f"weights after the trial ({speedup})")
    return reducer, modes


# A slow link in the timed uncompressed steps (2 and 3): both ranks waited most of each for the exchange, so the
# trial runs compressed steps from step 4; those are far shorter and the first decides for compressing.
reducer, modes = through_optimizer(1.5, slow_link=(2, 3))
assert modes == [True, True, True, False, False, False, False, False], modes
state = reducer.trial.state()
assert reducer.trial.decision is True and 0.25 < state["waited_seconds"] < state["plain_seconds"], state
assert 0 < state["work_seconds"] < 0.5, state  # a rank-1 PowerSGD of one small layer, rehearsed
# The same, but rank 1 is slow in the compressed steps: they are no shorter, so after two of them the trial stops,
# and the later steps are reduced uncompressed during backward again, the last residual with them.
reducer, modes = through_optimizer(1.5, slow_link=(2, 3), slow_rank_1=range(4, 9))
assert modes == [True, True, True, False, False, True, True, True], modes
assert reducer.trial.decision is False and reducer.trial.state()["compressed_steps"] == 2, reducer.trial.state()
assert reducer.residuals == {}
# Rank 1 slow in every step: rank 0 waits for it half of each step, but the exchange itself keeps neither rank
# waiting (rank 1, the later, hardly waits), and compression would not make rank 1 faster: no, before any
# compressed step.
reducer, modes = through_optimizer(1.5, slow_rank_1=range(1, 9))
assert modes == [True] * 8, modes
state = reducer.trial.state()
assert reducer.trial.decision is False and state["compressed_seconds"] is None, state
assert state["plain_seconds"] > 0.25 and state["waited_seconds"] < 0.1, state
# No wait at all: no compression can make the steps 50x shorter, and the trial says so before compressing any.
reducer, modes = through_optimizer(50)
assert modes == [True] * 8, modes
state = reducer.trial.state()
assert reducer.trial.decision is False and state["compressed_seconds"] is None, state
assert state["waited_seconds"] < state["plain_seconds"] * (1 - 1 / 50), state
assert reducer.residuals == {}
assert reducer.last_sent_bytes == reducer.last_dense_bytes == (48 * 32 + 32) * 4
# One slow rehearsal (a rank descheduled in it, say) does not stand for every compressed step: of its runs the
# trial weighs the shorter, and leaves them all out of the step's timing.
params, names = fake_params([(40, 30)])
params[0].grad = torch.ones(40, 30)
reducer = PowerSGDReducer(
    names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=2, min_step_speedup=1.5, trial_steps=2
)
runs, excluded = iter([0.6, 0.01]), []
reducer._compress_on_copies = lambda chosen, keep: next(runs)
reducer.trial.exclude = excluded.append
assert reducer._compression_work(params) == 0.01 and excluded == [0.61], excluded
