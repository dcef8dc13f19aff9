"""Pass: the applicable baselines raced at the start, the schedules the search must beat.

Up to BASELINE_TASKS tasks every raced baseline runs while it fits the race's share of the clock.
Above, only those built in time linear in the tasks (baselines.linear) run: the first of them
whatever the clock says (it is the valid answer the search falls back on when time runs out,
and the search's own first schedule costs as much), the others while they fit the share. The
seconds per task of the first one measured are the search's measure of what a build of N tasks
costs on this machine (State.per_task)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...baselines import BaselineError, linear, raced, run_baseline
from ...schedule import ScheduleError
from ..budget import Budget, Clock
from ..state import State

log = logging.getLogger(__name__)
BASELINE_TASKS = 40_000  # every raced baseline runs up to this many tasks (N x blocks); only linear ones above


def racing(share: Callable[[Budget], float]) -> Callable[[State, Clock], None]:
    """The race, where a baseline that would take more than `share` of the time left when it
    starts is skipped."""
    def run(state: State, clock: Clock) -> None:
        race(state, clock, share(state.budget))
    return run


def race(state: State, clock: Clock, share: float = 1.0) -> None:
    """The applicable baselines on the real placement, greedy (the slowest) last, into
    state.rivals. One that would take more than `share` of the clock left is skipped."""
    p, n = state.problem.placement, state.micro_batches
    tasks = n * len(p.blocks)
    if not state.budget.race:
        return
    large = tasks > BASELINE_TASKS
    names = sorted(raced(p), key=lambda x: x == "greedy")  # torch's generators only on request
    if large:  # gpipe last: it holds all N micro-batches' activations, the first to miss a limit
        names = sorted((x for x in names if linear(x, p)), key=lambda x: x == "gpipe")
    per_baseline = tasks * state.budget.baseline_per_task
    for name in names:
        fallback = large and not state.rivals  # the answer in hand, however short the clock
        if per_baseline > clock.left() * share and not fallback:
            log.info("baseline %s skipped: about %.1fs, over the race's share", name, per_baseline)
            continue
        t1 = time.perf_counter()
        try:  # without its repetend: a few times cheaper; found later if this one wins
            state.rivals.append(run_baseline(name, p, n, state.problem.real_limit(), repetend=False))
        except (BaselineError, ScheduleError) as e:  # it does not fit this placement or memory
            log.info("baseline %s not a candidate: %s", name, e)
        per_baseline = time.perf_counter() - t1
        if state.per_task is None and state.rivals:
            state.per_task = per_baseline / tasks
