"""Whether gradient compression pays on this job's links, decided from the job's own steps.

Compression with error feedback sends fewer bytes but delays part of each gradient, so a model takes more steps to
reach a given accuracy. Where the link is what a step waits for, the shorter steps win by far; where the compute
is, the steps barely shorten and the extra steps make training slower. With `min_step_speedup` set, a reducer
times the last `trial_steps` of its uncompressed warm-up steps (`start_iter`, lengthened to `trial_steps + 1` if
shorter) and the first `trial_steps` compressed ones, each from the end of one step's reduction to the end of the
next, and keeps compressing only if the compressed steps' median was at least `min_step_speedup` times shorter.
The ranks average their medians in one allreduce, so all decide alike.

The trial's compressed steps run the compressed exchange for its time only: its result is dropped, no residual is
kept, and the step applies the exact average, which the reducer reduces after the step is timed and leaves out of
the timing (`exclude`). A trial that decides against compressing then costs the job some time, but no progress.
Those exact exchanges are what a slow link makes expensive, and there compression wins by far: from the first
compressed step on, the trial decides at once for compression when the compressed steps so far (their median) were
`EARLY_MARGIN` times further ahead than `min_step_speedup` asks. Where the link is fast, the exact exchanges are
cheap but still the trial's whole cost: from the `EARLY_NO_STEPS`-th compressed step on, the trial decides against
compressing when even the fastest compressed step so far was not halfway to the asked speedup (shorter than the
uncompressed steps' median by less than its square root). A first compressed step may carry one-time costs, which
can only make it look slower: enough to say yes on, not to say no.

Where the link is fast, the compressed steps need not run at all. Compression can shorten a step by no more than the
time the step waits for its exchange (each step's least wait over the ranks: a rank that also waited for a slower
rank's backward would wait for it just as long with compression), and it adds work of its own (PowerSGD's products
and orthonormalisation, top-k's selection, and the compressed exchange, which on a fast link costs its latencies
rather than its bytes), so the reducers also report, for each uncompressed step, how long it waited for its
gradients after its own work was done (the part of the exchange that backward did not hide), and, on the trial's
last uncompressed step, how long a compressed exchange of that step's gradients takes (a rehearsal: compressed and
exchanged for real, the result dropped). When the uncompressed steps would not be `min_step_speedup` times shorter
without that wait and with that work, the trial decides against compressing after its uncompressed steps, for the
price of the rehearsal and two small allreduces.
"""

import logging
import math
import statistics
import time
from typing import Callable, List, Optional, Sequence

logger = logging.getLogger("hvdlite.compression")

EARLY_NO_STEPS = 2
EARLY_MARGIN = 2.0
REHEARSALS = 2  # rehearsed compressed exchanges timed on the trial's last uncompressed step; the shortest counts


def check_trial(min_step_speedup: Optional[float], trial_steps: int) -> None:
    if min_step_speedup is not None and not min_step_speedup >= 1:
        raise ValueError(f"min_step_speedup must be >= 1 (or None: always compress), got {min_step_speedup}")
    if trial_steps < 1:
        raise ValueError(f"trial_steps must be >= 1, got {trial_steps}")


class CompressionTrial:
    """One reducer's schedule: uncompressed up to start_iter and, with min_step_speedup, the trial's compressed
    steps after it, then what it decided. Iterations count from 1, as the reducers count them; every rank computes
    the same schedule."""

    def __init__(self, start_iter: int, min_step_speedup: Optional[float], trial_steps: int, kind: str):
        check_trial(min_step_speedup, trial_steps)
        self.start_iter = start_iter
        self.min_step_speedup = min_step_speedup
        self.trial_steps = trial_steps
        self.kind = kind
        self.decision: Optional[bool] = None  # None: not decided (or no trial); True: compress; False: do not
        self.plain_seconds: Optional[float] = None  # the medians it was decided on (the ranks' average)
        self.compressed_seconds: Optional[float] = None
        # The last uncompressed iteration of the trial: it times the trial_steps iterations up to this one, and the
        # trial_steps after it compressed. The first iteration is never timed (nothing ends before it).
        self.trial_from = max(start_iter, trial_steps + 1)
        self._last_end: Optional[float] = None
        self._excluded = 0.0  # seconds of work a compressed step would not do, left out of the next timed step
        self._plain: List[float] = []
        self._waits: List[float] = []  # of the timed uncompressed steps: seconds spent waiting for the exchange
        self._compressed: List[float] = []
        self.waited_seconds: Optional[float] = None  # median of each step's least wait over the ranks, once checked
        self.work_seconds: Optional[float] = None  # the ranks' average rehearsal of a compressed exchange
        self.compressed_steps: Optional[int] = None  # how many compressed steps the decision was taken on

    def compresses(self, iteration: int) -> bool:
        """Whether this iteration's gradients are compressed."""
        if iteration <= self.start_iter:
            return False
        if self.min_step_speedup is None:
            return True
        if self.decision is not None:
            return self.decision
        return iteration > self.trial_from

    def shadows(self, iteration: int) -> bool:
        """Whether this iteration is one of the trial's compressed steps, which time a compressed exchange but
        apply the exact average."""
        return self.min_step_speedup is not None and self.decision is None and self.compresses(iteration)

    def measures_work(self, iteration: int) -> bool:
        """Whether this (uncompressed) iteration should time a rehearsal of a compressed exchange for step_done's
        work (a collective: every rank gets the same answer)."""
        return self.min_step_speedup is not None and self.decision is None and iteration == self.trial_from

    def weigh_rehearsals(self, rehearse: Callable[[], float]) -> float:
        """Runs `rehearse` (one rehearsed compressed exchange, returning its seconds) REHEARSALS times, leaves them
        all out of the step's timing and returns the shortest: a rank descheduled in a single run would otherwise
        stand for every compressed step."""
        runs = [rehearse() for _ in range(REHEARSALS)]
        self.exclude(sum(runs))
        return min(runs)

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` (the trial's own extra work: copies, the exact exchange) out of the step they fall in:
        the current one if called before its step_done, else the next."""
        self._excluded += seconds

    def step_done(
        self,
        iteration: int,
        agree: Callable[..., Sequence[float]],
        waited: Optional[float] = None,
        work: Optional[float] = None,
    ) -> None:
        """Called when an iteration's reduction has ended. `agree(values)` averages a few numbers over the ranks
        and `agree(values, least=True)` takes each one's minimum (collectives every rank reaches at the same
        iteration). `waited`: for an uncompressed step, the seconds it waited for its exchange once its own work
        was done (None: not known). `work`: where measures_work said so, the seconds a rehearsed compressed
        exchange of this step's gradients took (None: not measured, taken as nothing)."""
        now = time.perf_counter()
        previous, self._last_end = self._last_end, now
        excluded, self._excluded = self._excluded, 0.0
        if self.min_step_speedup is None or self.decision is not None:
            return
        if previous is not None and iteration > self.trial_from - self.trial_steps:
            if self.compresses(iteration):
                self._compressed.append(now - previous - excluded)
            else:
                self._plain.append(now - previous - excluded)
                if waited is not None:
                    self._waits.append(waited)
        # Each branch runs at the same iterations on every rank: agree is collective.
        if iteration >= self.trial_from + self.trial_steps:
            self._decide(iteration, agree)
        elif iteration == self.trial_from:
            self._decide_from_waits(agree, work or 0.0)
        elif iteration > self.trial_from:
            self._decide_early(agree)

    def _decide_from_waits(self, agree, work: float) -> None:
        """Against compressing, before any compressed step, where even a step that did not wait for its exchange
        but did a compressed one would not be min_step_speedup times shorter.

        The wait that compression can save is each step's least over the ranks: the rank whose own work ended
        last waited only for the exchange, and the others waited for that rank as well, which a compressed
        exchange would not change (ranks that share cores, or a straggler, make that part large)."""
        complete = bool(self._plain) and len(self._waits) == len(self._plain)
        # Every rank's lists end at this iteration, so aligning them on their ends aligns the steps; -1: no figure.
        waits = self._waits[-self.trial_steps :] if complete else []
        mine = [-1.0] * (self.trial_steps - len(waits)) + waits
        *least, all_complete = agree(mine + [1.0 if complete else 0.0], least=True)
        median_plain = statistics.median(self._plain) if complete else 0.0
        median_wait = statistics.median(self._waits) if complete else 0.0
        plain, average_wait, work = (float(x) for x in agree([median_plain, median_wait, work]))
        self._waits = []
        self.work_seconds = work
        known = [float(x) for x in least if x >= 0]
        if all_complete < 1.0 or not known:
            return
        waited = statistics.median(known)
        self.waited_seconds = waited
        without_wait = plain - waited + work
        if without_wait <= 0 or plain >= self.min_step_speedup * without_wait:
            return
        self.plain_seconds = plain
        self.decision = False
        self.compressed_steps = 0
        self._plain = []
        logger.info(
            "%s: uncompressed steps took %.1f ms (median, the ranks' average); the exchange kept them waiting "
            "%.1f ms (median of each step's least wait over the ranks; %.1f ms on the ranks' average), and a "
            "compressed exchange of their gradients takes %.1f ms: compression could make them at most %.2fx "
            "shorter; not compressing",
            self.kind,
            1000 * plain,
            1000 * waited,
            1000 * average_wait,
            1000 * work,
            plain / without_wait,
        )

    def _decide_early(self, agree) -> None:
        complete = bool(self._plain and self._compressed)
        mine = (
            [statistics.median(self._plain), statistics.median(self._compressed), min(self._compressed)]
            if complete
            else [0.0, 0.0, 0.0]
        )
        plain, compressed, fastest, all_complete = (float(x) for x in agree(mine + [1.0 if complete else 0.0]))
        if all_complete < 1.0:
            return
        if plain >= EARLY_MARGIN * self.min_step_speedup * compressed:
            self.decision = True
        elif len(self._compressed) >= EARLY_NO_STEPS and plain < math.sqrt(self.min_step_speedup) * fastest:
            self.decision = False
        else:
            return
        self.plain_seconds, self.compressed_seconds = plain, compressed
        self.compressed_steps = steps = len(self._compressed)
        self._plain, self._compressed = [], []
        logger.info(
            "%s: uncompressed steps took %.1f ms, compressed %.1f ms (median, the ranks' average; the fastest "
            "compressed %.1f ms); %s, decided after %d compressed steps",
            self.kind,
            1000 * plain,
            1000 * compressed,
            1000 * fastest,
            "compressing from now on" if self.decision else "not compressing",
            steps,
        )

    def _decide(self, iteration: int, agree) -> None:
        # A rank without a figure of each kind (it joined or restored during the trial) says so, and then every
        # rank starts the trial over from here.
        complete = bool(self._plain and self._compressed)
        mine = [statistics.median(self._plain), statistics.median(self._compressed)] if complete else [0.0, 0.0]
        plain, compressed, all_complete = (float(x) for x in agree(mine + [1.0 if complete else 0.0]))
        self._plain, self._waits, self._compressed = [], [], []
        if all_complete < 1.0:
            self.trial_from = iteration + self.trial_steps
            return
        self.plain_seconds, self.compressed_seconds = plain, compressed
        self.compressed_steps = self.trial_steps
        self.decision = plain >= self.min_step_speedup * compressed
        logger.info(
            "%s: uncompressed steps took %.1f ms, compressed %.1f ms (median, the ranks' average); %s",
            self.kind,
            1000 * plain,
            1000 * compressed,
            "compressing from now on"
            if self.decision
            else f"not compressing (less than {self.min_step_speedup}x shorter)",
        )

    # -- state: the same on every rank (elastic commit/restore, broadcast when the membership changes)
    def state(self) -> dict:
        return {
            "decision": self.decision,
            "plain_seconds": self.plain_seconds,
            "compressed_seconds": self.compressed_seconds,
            "waited_seconds": self.waited_seconds,
            "work_seconds": self.work_seconds,
            "compressed_steps": self.compressed_steps,
            "trial_from": self.trial_from,
        }

    def load_state(self, state: dict, iteration: int) -> None:
        self.decision = state.get("decision")
        self.plain_seconds = state.get("plain_seconds")
        self.compressed_seconds = state.get("compressed_seconds")
        self.waited_seconds = state.get("waited_seconds")
        self.work_seconds = state.get("work_seconds")
        self.compressed_steps = state.get("compressed_steps")
        self.trial_from = state.get("trial_from", self.trial_from)
        # A trial cut short starts over from the restored iteration: the figures taken since are not the state's.
        if self.decision is None and iteration > self.trial_from - self.trial_steps:
            self.trial_from = iteration + self.trial_steps
        self._plain, self._waits, self._compressed, self._last_end, self._excluded = [], [], [], None, 0.0
