"""PowerSGD and top-k compression with error feedback (hvdlite.torch.gradient_reducers), across real processes."""

import pytest
from multiproc import run_checked

from hvdlite.common import compression_trial

COMMON = """
import torch, torch.nn as nn, torch.nn.functional as F
import hvdlite.torch as hvd
from hvdlite.torch.gradient_reducers import PowerSGDReducer, TopKReducer
hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()

def same_everywhere(t, what):
    everyone = hvd.allgather(t.detach().reshape(1, -1), name="check." + what)
    return all(torch.equal(everyone[r], everyone[R]) for r in range(N))

def fake_params(shapes):
    params = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    names = {id(p): f"p{i}" for i, p in enumerate(params)}
    return params, names
"""


def run(script, np=2, timeout=120):
    return run_checked(COMMON + script + '\nprint("DONE", flush=True)\n', np, timeout=timeout)


@pytest.mark.timeout(150)
def test_powersgd_recovers_a_low_rank_average_exactly_in_one_step():
    """M_i = u v_i^T on each rank: the average is rank 1, so one power iteration of rank 1 reproduces it, leaves
    no residual over the ranks, and sends (n + m) numbers per matrix instead of n m. A vector and a matrix too
    small to gain go uncompressed and arrive exactly."""
    run(
        """
params, names = fake_params([(64, 48), (16,), (2, 2)])
reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=1, start_iter=0)
u = torch.randn(64, generator=torch.Generator().manual_seed(1))
v = [torch.randn(48, generator=torch.Generator().manual_seed(10 + r)) for r in range(N)]
grads = [torch.outer(u, v[R]), torch.full((16,), float(R)), torch.full((2, 2), float(R + 1))]
for p, g in zip(params, grads):
    p.grad = g.clone()
reducer.reduce(params)
mean_v = torch.stack(v).mean(0)
torch.testing.assert_close(params[0].grad, torch.outer(u, mean_v), rtol=1e-4, atol=1e-4)
assert torch.equal(params[1].grad, torch.full((16,), (N - 1) / 2))
assert torch.equal(params[2].grad, torch.full((2, 2), (N + 1) / 2))
# Each rank keeps what it sent beyond the average (M_i - mean); over the ranks that is nothing.
torch.testing.assert_close(reducer.residuals["p0"], torch.outer(u, v[R] - mean_v), rtol=1e-4, atol=1e-4)
assert hvd.allreduce(reducer.residuals["p0"], name="residual").abs().max() < 1e-4
assert set(reducer.residuals) == {"p0"}  # uncompressed gradients keep no residual
assert reducer.last_sent_elements == (64 + 48) + 16 + 4 and reducer.last_dense_elements == 64 * 48 + 16 + 4
assert same_everywhere(params[0].grad, "approximation")
"""
    )


@pytest.mark.timeout(150)
def test_error_feedback_keeps_the_sum_of_applied_updates_equal_to_the_sum_of_true_gradients():
    """Over many steps of random full-rank gradients, what the ranks applied plus their mean residual is the sum of
    the true averaged gradients, for PowerSGD and top-k: compression delays what it drops, it loses nothing. The
    applied updates are the same on every rank."""
    run(
        """
for kind in ("powersgd", "topk"):
    params, names = fake_params([(40, 30), (8, 4, 3, 3), (30,)])
    if kind == "powersgd":
        reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=2)
    else:
        reducer = TopKReducer(names, hvd.global_process_set, hvd.Average, hvd, ratio=0.05, start_iter=2)
    applied = [torch.zeros_like(p) for p in params]
    true_sum = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(100 + R)
    for step in range(12):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        everyone = [hvd.allreduce(grad, name=f"true.{i}", op=hvd.Average) for i, grad in enumerate(grads)]
        reducer.reduce(params)
        for a, t, p, mean in zip(applied, true_sum, params, everyone):
            a += p.grad
            t += mean
            assert same_everywhere(p.grad, "applied"), (kind, step)
        if step >= 2:  # compressing now: fewer numbers sent than the dense gradients hold
            assert reducer.last_sent_elements * 2 <= reducer.last_dense_elements, (kind, reducer.last_sent_elements)
    for i, (a, t, p) in enumerate(zip(applied, true_sum, params)):
        residual = reducer.residuals.get(f"p{i}", torch.zeros_like(p))
        mean_residual = hvd.allreduce(residual, name=f"residual.{i}", op=hvd.Average)
        torch.testing.assert_close(a + mean_residual, t, rtol=1e-4, atol=1e-4)
        if i < 2:
            assert residual.abs().sum() > 0, f"{kind}: a compressed gradient kept no residual"
"""
    )


@pytest.mark.timeout(150)
def test_a_failed_compressed_exchange_leaves_gradient_and_residual_as_they_were():
    """PowerSGD builds gradient + residual in the residual's memory: when an exchange fails (here Q's, whose size
    differs between the ranks), the error reaches every rank, the residual and the gradient are as before the step,
    and the job goes on."""
    run(
        """
params, names = fake_params([(40, 30 + R)])
reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=0)
reducer.residuals["p0"] = torch.full((40, 30 + R), 0.5)
grad = torch.randint(-8, 8, (40, 30 + R), generator=torch.Generator().manual_seed(R)) / 4  # exact sums
params[0].grad = grad.clone()
try:
    reducer.reduce(params)
except Exception as e:  # noqa: BLE001
    assert "powersgd.Q" in str(e), e
else:
    raise AssertionError("an exchange of mismatched sizes went through")
assert torch.equal(reducer.residuals["p0"], torch.full((40, 30 + R), 0.5))
assert torch.equal(params[0].grad, grad)
assert hvd.allreduce(torch.ones(3), name="after", op=hvd.Sum).tolist() == [float(N)] * 3
"""
    )


@pytest.mark.timeout(150)
def test_a_trial_keeps_compression_only_where_it_shortens_the_step():
    """With min_step_speedup, a reducer times its last trial_steps uncompressed warm-up steps and the first
    trial_steps compressed ones, and every rank takes the same decision from the ranks' average medians. The
    trial's compressed steps time the compressed exchange but apply the exact average. Where the uncompressed
    steps are slow (a sleep stands in for a slow link) it keeps compressing; where compressed steps are not that
    much shorter it stops, and every gradient applied, in the trial too, is the true average. Where compressed steps
    are far shorter, it decides for compression after two of them. Through
    DistributedOptimizer, the steps a reducer does not compress are reduced the usual way (during backward where
    the optimizer does that) and still counted, timed and recorded."""
    run(
        """
import time
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
        # A step is timed from the end of the last one's reduction to the end of its own.
        if slow_plain and LAST_PLAIN - T < step <= LAST_PLAIN:
            time.sleep(0.2)
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
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                   named_parameters=net.named_parameters(),
                                   compression=hvd.Compression.powersgd(rank=1, start_iter=1,
                                                                        min_step_speedup=speedup, trial_steps=2),
                                   reduce_during_backward=True)
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
reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=2,
                          min_step_speedup=1.5, trial_steps=2)
runs, excluded = iter([0.6, 0.01]), []
reducer._compress_on_copies = lambda chosen, keep: next(runs)
reducer.trial.exclude = excluded.append
assert reducer._compression_work(params) == 0.01 and excluded == [0.61], excluded
"""
    )


def test_the_wait_for_the_exchange_bounds_what_compression_could_gain(monkeypatch):
    """Compression cannot shorten a step by more than the step waited for its exchange, and it adds its own work:
    where even a step without that wait but with that work would not be min_step_speedup times shorter, the trial
    decides against compressing after its uncompressed steps; otherwise, or when a rank could not say how long it
    waited, the compressed steps run. The wait is each step's least over the ranks: what a rank waited beyond it
    was for a slower rank's backward, which compression would not shorten."""
    clock = [0.0]
    monkeypatch.setattr(compression_trial.time, "perf_counter", lambda: clock[0])

    def trial_after_uncompressed_steps(waits, work=None, other_waits=None):
        """One rank's trial; other_waits: a second rank's waits (each step's), which `agree` combines with it."""
        trial = compression_trial.CompressionTrial(start_iter=2, min_step_speedup=1.25, trial_steps=4, kind="x")
        assert trial.trial_from == 5
        agreed = []

        def agree(values, least=False):
            agreed.append((list(values), least))
            if other_waits is None:  # one rank: its own figures
                return values
            if least:  # the other rank's waits of steps 2-5, and complete
                return [min(a, b) for a, b in zip(values, [other_waits(i) for i in range(2, 6)] + [1.0])]
            return values  # the same step times and work on both

        for iteration in range(1, 6):
            clock[0] += 0.060
            assert trial.measures_work(iteration) == (iteration == 5)
            trial.step_done(iteration, agree, waits(iteration), work if iteration == 5 else None)
        return trial, agreed

    trial, agreed = trial_after_uncompressed_steps(lambda i: 0.005)  # at most 60 / 55 = 1.09x shorter
    assert trial.decision is False and not trial.compresses(6) and not trial.shadows(6)
    # Steps 2-5 are timed (step 1 has no start): their waits, the least over the ranks, then the averages.
    assert agreed == [
        ([pytest.approx(0.005)] * 4 + [1.0], True),
        ([pytest.approx(0.060), pytest.approx(0.005), 0.0], False),
    ]
    assert trial.state()["compressed_seconds"] is None and trial.state()["plain_seconds"] == pytest.approx(0.060)
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030)  # up to 2x: worth trying
    assert trial.decision is None and trial.shadows(6) and trial.waited_seconds == pytest.approx(0.030)
    trial, agreed = trial_after_uncompressed_steps(lambda i: 0.030, work=0.030)  # 60 / (60 - 30 + 30): no gain
    assert trial.decision is False and trial.work_seconds == pytest.approx(0.030) and not trial.compresses(6)
    assert agreed[1] == ([pytest.approx(0.060), pytest.approx(0.030), pytest.approx(0.030)], False)
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030, work=0.005)  # 60 / 35 = 1.7x: still worth trying
    assert trial.decision is None and trial.shadows(6)
    trial, agreed = trial_after_uncompressed_steps(lambda i: None if i == 3 else 0.005)  # one step unknown
    assert trial.decision is None and trial.shadows(6) and agreed[0] == ([-1.0] * 4 + [0.0], True)
    # This rank waited 30 ms a step, but the other only 5, 10, 5 and 5 (it finished its backward 25 ms later in
    # most steps): the exchange itself kept the steps waiting 5 ms (the median of the least), so no.
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030, other_waits=lambda i: 0.010 if i == 3 else 0.005)
    assert trial.decision is False and trial.waited_seconds == pytest.approx(0.005)
    # The slower rank alternates: every step, one of the ranks waited only for the exchange.
    trial, _ = trial_after_uncompressed_steps(
        lambda i: 0.030 if i % 2 else 0.005, other_waits=lambda i: 0.005 if i % 2 else 0.030
    )
    assert trial.decision is False and trial.waited_seconds == pytest.approx(0.005)
    # Both waited 30 ms or more in every step: the link's, worth trying.
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.040, other_waits=lambda i: 0.030)
    assert trial.decision is None and trial.shadows(6) and trial.waited_seconds == pytest.approx(0.030)


def test_a_trial_ends_at_once_where_compressed_steps_are_not_shorter_or_far_shorter(monkeypatch):
    """For compression from the first compressed step on, when the compressed steps' median is EARLY_MARGIN times
    beyond min_step_speedup; against it from the second, when even the fastest was not halfway there (by less than
    its square root shorter than the uncompressed median); otherwise the trial goes on (a slow first compressed step
    alone does not end it)."""
    clock = [0.0]
    monkeypatch.setattr(compression_trial.time, "perf_counter", lambda: clock[0])

    def trial_with(compressed_steps):
        trial = compression_trial.CompressionTrial(start_iter=2, min_step_speedup=1.25, trial_steps=4, kind="x")
        for iteration in range(1, 6):  # uncompressed, 60 ms each, half of it waiting: up to 2x shorter
            clock[0] += 0.060
            trial.step_done(iteration, lambda values, least=False: values, 0.030)
        for iteration, seconds in enumerate(compressed_steps, start=6):
            if trial.decision is not None:
                break
            assert trial.shadows(iteration)
            clock[0] += seconds
            trial.step_done(iteration, lambda values, least=False: values)
        return trial

    assert trial_with([0.070, 0.061]).decision is False  # neither shorter
    assert trial_with([0.056, 0.058]).decision is False  # 60 / 56 = 1.07x: short of the square root of 1.25 (1.118)
    assert trial_with([0.020, 0.025]).decision is True  # 3x shorter: beyond 2 x 1.25, decided on the first
    assert trial_with([0.020, 0.025]).state()["compressed_steps"] == 1
    assert trial_with([0.070]).decision is None  # one step is not enough to say no
    undecided = trial_with([0.120, 0.050])  # one 1.2x shorter, past halfway, not yet by enough: the trial goes on
    assert undecided.decision is None and undecided.shadows(8)
    assert trial_with([0.120, 0.050, 0.050, 0.050]).decision is False  # 60 / 50 = 1.2x: short of 1.25 at the end


@pytest.mark.timeout(200)
def test_training_converges_with_compression():
    """A 2-rank MLP learns a teacher's labels through each compressor (and with gradient accumulation) to within
    5 points of the same training uncompressed, the weights stay identical on every rank, and compression sends
    at most half of the gradients' numbers."""
    out = run(
        """
torch.manual_seed(0)
teacher = nn.Linear(32, 10)
test_x = torch.randn(512, 32, generator=torch.Generator().manual_seed(99))
test_y = teacher(test_x).argmax(1)

def train(label, compression, passes):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=[(f"{label}.{n}", p) for n, p in model.named_parameters()],
        compression=compression, backward_passes_per_step=passes)
    g = torch.Generator().manual_seed(7 + R)  # the same batches for every configuration
    for step in range(300):
        opt.zero_grad()
        for _ in range(passes):
            x = torch.randn(32, 32, generator=g)
            F.cross_entropy(model(x), teacher(x).argmax(1)).backward()
        opt.step()
    assert same_everywhere(torch.cat([p.detach().flatten() for p in model.parameters()]), label), label
    return (model(test_x).argmax(1) == test_y).float().mean().item(), opt

reference = {passes: train(f"reference{passes}", hvd.Compression.none, passes)[0] for passes in (1, 2)}
for kind, passes in (("powersgd", 1), ("topk", 1), ("powersgd", 2)):
    compression = {"powersgd": hvd.Compression.powersgd(rank=2, start_iter=5),
                   "topk": hvd.Compression.topk(ratio=0.1, start_iter=5)}[kind]
    accuracy, opt = train(f"{kind}{passes}", compression, passes)
    reducer = opt.gradient_reducer
    assert reducer.iteration == 300, reducer.iteration
    assert reducer.last_sent_elements * 2 <= reducer.last_dense_elements
    print(f"rank {R} {kind} passes {passes} accuracy {accuracy:.3f} uncompressed {reference[passes]:.3f}",
          flush=True)
    assert accuracy >= reference[passes] - 0.05 and accuracy > 0.5, (kind, passes, accuracy, reference)
""",
        timeout=180,
    )
    assert out.count("accuracy") == 6, out


@pytest.mark.timeout(150)
def test_compression_errors_and_process_sets():
    """Usage errors name what is wrong; a process set of two out of three ranks compresses among itself while the
    third trains alone."""
    run(
        """
import pytest
for bad, message in ((lambda: hvd.Compression.powersgd(rank=0), "rank must be >= 1"),
                     (lambda: hvd.Compression.topk(ratio=0), "ratio must be in"),
                     (lambda: hvd.Compression.powersgd(start_iter=-1), "start_iter"),
                     (lambda: hvd.Compression.powersgd(min_step_speedup=0.5), "min_step_speedup must be >= 1"),
                     (lambda: hvd.Compression.topk(min_step_speedup=2, trial_steps=0), "trial_steps")):
    with pytest.raises(ValueError, match=message):
        bad()
model = nn.Embedding(10, 4, sparse=True)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.topk(0.5))
model(torch.tensor([1, 2])).sum().backward()
with pytest.raises(ValueError, match="has a sparse one"):
    opt.step()
opt.zero_grad()
with pytest.raises(ValueError, match="gradient_predivide_factor"):
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), gradient_predivide_factor=2.0,
                             compression=hvd.Compression.powersgd())

pair = hvd.add_process_set([0, 1])
torch.manual_seed(0)
net = nn.Linear(20, 20, bias=False)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), process_set=pair,
                               compression=hvd.Compression.powersgd(rank=1, start_iter=0))
for step in range(3):
    opt.zero_grad()
    net(torch.randn(4, 20, generator=torch.Generator().manual_seed(R * 10 + step))).pow(2).sum().backward()
    opt.step()
weights = hvd.allgather(net.weight.detach().reshape(1, -1), name="check.pair")
assert torch.equal(weights[0], weights[1])
assert not torch.equal(weights[0], weights[2])
assert (opt.gradient_reducer.iteration == 3) == (R < 2), opt.gradient_reducer.iteration
""",
        np=3,
    )


@pytest.mark.timeout(150)
def test_elastic_state_commits_and_restores_residuals_and_warm_start():
    """TorchState.commit() keeps each rank's residuals and the shared warm-start matrices; restore() brings them
    back after steps that failed to commit; sync() gives every rank rank 0's warm start and keeps its own
    residuals."""
    run(
        """
from hvdlite.torch.elastic import TorchState
torch.manual_seed(0)
net = nn.Linear(24, 16)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                               compression=hvd.Compression.powersgd(rank=2, start_iter=0))
def train(steps, seed):
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(8, 24, generator=torch.Generator().manual_seed(seed + 100 * R + step))
        net(x).pow(2).mean().backward()
        opt.step()
train(3, 0)
state = TorchState(model=net, optimizer=opt, epoch=0)
state.commit()
reducer = opt.gradient_reducer
committed = reducer.state_dict()
assert committed["shared"]["iteration"] == 3 and set(committed["local"]["residuals"]) == {"weight"}
train(2, 50)
assert reducer.iteration == 5
assert not torch.equal(reducer.residuals["weight"], committed["local"]["residuals"]["weight"])
state.restore()
assert reducer.iteration == 3
assert torch.equal(reducer.residuals["weight"], committed["local"]["residuals"]["weight"])
assert torch.equal(reducer.qs["weight"], committed["shared"]["qs"]["weight"])
# A rank whose warm start went astray (as a new worker's would be) gets rank 0's at sync; residuals stay local.
if R == 1:
    reducer.qs["weight"] = torch.zeros_like(reducer.qs["weight"])
    reducer.iteration = 0
own = reducer.residuals["weight"].clone()
state.sync()
assert reducer.iteration == 3 and torch.equal(reducer.qs["weight"], committed["shared"]["qs"]["weight"])
assert torch.equal(reducer.residuals["weight"], own)
assert same_everywhere(reducer.qs["weight"], "warm start")
train(2, 80)
assert same_everywhere(net.weight, "weights after sync")
"""
    )


@pytest.mark.timeout(150)
def test_timeline_records_what_compression_local_sgd_and_staleness_did(tmp_path):
    """With a timeline, every step of a compressing optimizer adds a counter event of the bytes sent against the
    uncompressed and their ratio, local SGD one of the bytes averaged, and bounded staleness one of the exchanges
    in flight and the bytes applied; the trace stays well formed."""
    path = tmp_path / "timeline.json"
    run(
        f"""
hvd.start_timeline({str(path)!r})
for label, settings in (("powersgd", dict(compression=hvd.Compression.powersgd(rank=1, start_iter=1))),
                        ("topk", dict(compression=hvd.Compression.topk(ratio=0.02, start_iter=1))),
                        ("local", dict(sync_every=2)),
                        ("stale", dict(staleness=2))):
    torch.manual_seed(0)
    net = nn.Linear(64, 32)  # a model per optimizer: each one's hooks count the passes of its parameters
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=[(f"{{label}}.{{n}}", p) for n, p in net.named_parameters()],
                                   **settings)
    for step in range(4):
        opt.zero_grad()
        net(torch.randn(4, 64)).pow(2).sum().backward()
        opt.step()
hvd.stop_timeline()
"""
    )
    from hvdlite.timeline import check, load

    events = load(str(path))
    assert check(events) == []
    counters = {}
    for event in events:
        if event.get("ph") == "C":
            counters.setdefault(event["name"], []).append(event["args"])
    dense = (64 * 32 + 32) * 4
    assert [c["dense_bytes"] for c in counters["powersgd"]] == [dense] * 4, counters["powersgd"]
    # Step 1 is a start_iter step (everything sent); then the matrix travels as P and Q of rank 1.
    assert [c["sent_bytes"] for c in counters["powersgd"]] == [dense] + [(64 + 32 + 32) * 4] * 3
    assert counters["powersgd"][-1]["compression_ratio"] > 10
    assert [c["compressing"] for c in counters["powersgd"]] == [0, 1, 1, 1]
    assert [c["sent_bytes"] for c in counters["topk"]][1:] == [(41 * 12) + 32 * 4] * 3, counters["topk"]
    assert [c["averaged_bytes"] for c in counters["local_sgd"]] == [0, dense, 0, dense]
    assert [c["steps_since_average"] for c in counters["local_sgd"]] == [1, 0, 1, 0]
    # Staleness 2: two exchanges in flight before the first average is applied at step 3.
    assert [c["in_flight"] for c in counters["staleness"]] == [1, 2, 2, 2], counters["staleness"]
    assert [c["applied_bytes"] for c in counters["staleness"]] == [0, 0, dense, dense]
    assert {c["bound"] for c in counters["staleness"]} == {2}
