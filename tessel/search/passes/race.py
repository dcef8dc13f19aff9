"""Pass: the applicable baselines raced (first, or late when cheap), the schedules the search must beat.

Up to BASELINE_TASKS tasks every raced baseline runs while it fits the race's share of the clock.
Above, only those built in time linear in the tasks (baselines.linear) run. At any size the first
linear one that fits the limit runs whatever the clock says (it is the valid answer the search
falls back on when time runs out, and the search's own first schedule costs as much), the others
while they fit the share; one not in closed form (v-mem's grid) stops at the clock's end
(tessel.baselines.deadline). The seconds per task of the first one measured are the search's
measure of what a build of N tasks costs on this machine (State.per_task)."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from ...baselines import BaselineError, futile, linear, orders, raced, run_baseline
from ...baselines.deadline import until
from ...numeric import EPS
from ...placement import Number, Placement
from ...schedule import ScheduleError, normalise_limit
from ...timing import order_peak
from ..budget import Budget, Clock
from ..state import State

log = logging.getLogger(__name__)
BASELINE_TASKS = 40_000  # every raced baseline runs up to this many tasks (N x blocks); only linear ones above


def racing(share: Callable[[Budget], float]) -> Callable[[State, Clock], None]:
    """The race, in at most `share` of the time left when it starts."""
    def run(state: State, clock: Clock) -> None:
        race(state, clock, share(state.budget))
    return run


def late(state: State, clock: Clock) -> None:
    """The race after the search's own completion (mode tessel, when `cheap`): every baseline
    runs, whatever the clock left, since the whole race was judged a small part of it."""
    race(state, clock, None)


def cheap(state: State) -> bool:
    """The race is expected to take at most Budget.race_late of the search's clock, so it can
    wait until the search's own schedule is known to miss the bound (and is skipped when not)."""
    p, b = state.problem.placement, state.budget
    tasks = state.micro_batches * len(p.blocks)
    if tasks > BASELINE_TASKS:  # the linear baselines race first there: the answer when time runs out
        return False
    return tasks * b.baseline_per_task * len(raced(p)) <= b.race_late * state.clock.limit


def race(state: State, clock: Clock, share: float | None = 1.0) -> None:
    """The applicable baselines on the real placement, in `order`, into state.rivals, once. The
    race takes at most `share` of the clock left when it starts (with no share, the clock): a
    baseline that would take longer than what is left of that is not begun, one not in closed
    form stops at the clock's end; one over the limit or `futile` there (v-mem where ZB-V's hand
    order fits) is skipped unbuilt."""
    p, n = state.problem.placement, state.micro_batches
    tasks = n * len(p.blocks)
    if state.raced or not state.budget.race:
        return
    state.raced = True
    large = tasks > BASELINE_TASKS
    names = order(p, raced(p, large), large)  # torch's generators only on request
    per_baseline = tasks * state.budget.baseline_per_task
    # the whole race's share, not each build's: five builds each allowed half the time left took
    # 10 of a 20 s search at p = 16 on 2 loaded cores (V-Min's memory), its own schedule 5.6% longer
    end = math.inf if share is None else time.perf_counter() + clock.left() * share
    for name in names:
        # the answer in hand, however short the clock: the first linear one that fits costs no more
        # than the search's own first schedule (a clock spent on loading CP-SAT, 2 s on a loaded
        # machine, skipped every baseline of a 3 s search, zb-v-hand's 0.06 s among them)
        fallback = not state.rivals and linear(name, p)
        if per_baseline > end - time.perf_counter() and not fallback:
            log.info("baseline %s skipped: about %.1fs, over the race's share", name, per_baseline)
            continue
        t1 = time.process_time()  # CPU, not wall: a loaded machine makes no baseline more work
        if (why := over_limit(name, p, n, state.problem.real_limit()) or futile(name, p, n, state.problem.real_limit())):
            log.info("baseline %s not a candidate: %s", name, why)
            continue
        # a build other than closed-form orders stops when the clock does (v-mem's grid: 22 s at
        # p = 16 on 2 loaded cores, where its CPU estimate said 1), not at the race's share: begun,
        # it is the best answer on the rows it races (V-Half's and V-Min's memory at p = 16: 4 rows
        # 5-8% longer when it stopped at the share); the fallback never does
        stop = math.inf if fallback or linear(name, p) else time.perf_counter() + clock.left()
        try:  # without its repetend: a few times cheaper; found later if this one wins
            with until(stop):
                state.rivals.append(run_baseline(name, p, n, state.problem.real_limit(), repetend=False))
        except (BaselineError, ScheduleError) as e:  # it does not fit this placement or memory, or ran out of time
            log.info("baseline %s not a candidate: %s", name, e)
        per_baseline = time.process_time() - t1
        if state.per_task is None and state.rivals:
            state.per_task = per_baseline / tasks


def order(p: Placement, names: Sequence[str], large: bool) -> list[str]:
    """The race's order: those built in linear time first (closed-form orders, timed once: the
    cheapest, and each one's time is the estimate that may skip the next), then v-mem (it races
    below zb-v-hand's memory, where the zero-bubble walks were shorter than it on 7 of the limits
    measured at p = 2-6, m = 2p-4p, both costs, latency or not, by 3.6% at most: the race's share
    goes to it first), greedy (the slowest) last; above the race size (all linear) gpipe last: it
    holds all N micro-batches' activations, the first to miss a limit."""
    if large:
        return sorted(names, key=lambda x: x == "gpipe")
    return sorted(names, key=lambda x: (x == "greedy", not linear(x, p), x != "v-mem"))


# ---- the memory pre-check ------------------------------------------------------------------
def over_limit(name: str, p: Placement, n: int, limit: Sequence[Number] | None) -> str | None:
    """Why baseline `name` cannot fit `limit`, from its per-device orders alone (baselines.orders;
    memory depends on nothing else), or None when it fits or has no orders in closed form. Linear
    in the tasks and without timing them: at 4,096 devices the builds it spares took seconds each."""
    lim = normalise_limit(limit, p.devices)
    found = None if lim is None else orders(name, p, n)
    if lim is None or found is None:
        return None
    for d, order in enumerate(found):
        peak = order_peak(p, order)
        if peak > lim[d] + EPS:
            return f"{name} needs memory {peak:g} on device {d}, over its limit {lim[d]:g}"
    return None
