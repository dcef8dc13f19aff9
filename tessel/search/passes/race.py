"""Pass: the applicable baselines raced at the start, the schedules the search must beat."""
from __future__ import annotations

import logging
import time

from ...baselines import BaselineError, raced, run_baseline
from ...schedule import ScheduleError
from ..budget import Clock
from ..state import State

log = logging.getLogger(__name__)
BASELINE_TASKS = 40_000  # baselines race against the search up to this many tasks (N x blocks)


def race(state: State, clock: Clock) -> None:
    """The applicable baselines on the real placement, greedy (the slowest) last, into
    state.rivals. One that would take longer than the clock has left is skipped."""
    p, n = state.problem.placement, state.micro_batches
    tasks = n * len(p.blocks)
    if tasks > BASELINE_TASKS or not state.budget.race:
        return
    per_baseline = tasks * state.budget.baseline_per_task
    for name in sorted(raced(p), key=lambda x: x == "greedy"):  # torch's generators only on request
        if per_baseline > clock.left():
            log.info("baseline %s skipped: about %.1fs, over the race's share", name, per_baseline)
            continue
        t1 = time.perf_counter()
        try:  # without its repetend: a few times cheaper; found later if this one wins
            state.rivals.append(run_baseline(name, p, n, state.problem.real_limit(), repetend=False))
        except (BaselineError, ScheduleError) as e:  # it does not fit this placement or memory
            log.info("baseline %s not a candidate: %s", name, e)
        per_baseline = time.perf_counter() - t1
