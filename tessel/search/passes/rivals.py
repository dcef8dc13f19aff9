"""Pass: the best baseline on the grid, compacted and completed like our own repetend, when it
beats our own (the search never returns a schedule longer than a baseline that ran)."""
from __future__ import annotations

import logging

from ...baselines import BASELINES, BaselineError
from ...schedule import Schedule, ScheduleError
from ..budget import Clock
from ..completion import compact, complete, makespan
from ..state import State
from .complete import sizes, with_kernel

log = logging.getLogger(__name__)


def completed_baseline(state: State, clock: Clock) -> None:
    p, n, mod, own = state.problem, state.micro_batches, state.modulo, state.best
    if mod is None or own is None or not state.affords(state.budget.own_builds):
        return
    grid = _grid_baselines(state, clock)
    if not grid or clock.expired():
        return
    name, base = min(grid.items(), key=lambda kv: kv[1].makespan)
    starts = compact(p, n, {key: int(round(v)) for key, v in base.start.items()})
    if p.real(makespan(p, starts)) >= own.makespan:
        return
    free, _ = sizes(p, mod, n)
    stall = state.budget.completion_stall(max(free, default=1), len(p.block_ids))
    done = complete(p, starts, n, free, clock, state.workers, stall, state.grid_bound(n),
                    state.budget.cap(stall, state.workers))
    state.statuses["completion_" + name] = list(done.statuses)
    kernels = [(mod.period, mod.copies)]
    if base.repetend is not None:
        kernels.append((int(round(base.repetend.period)), shift(base)))
    state.offer(with_kernel(p, n, done.starts, kernels, name) or with_kernel(p, n, done.starts, [], name))


def _grid_baselines(state: State, clock: Clock) -> dict[str, Schedule]:
    """The baselines on the grid placement: the real ones when the grid is exact, else run again
    on the grid's (rounded-up) durations."""
    p, n = state.problem, state.micro_batches
    if p.exact_time and p.resolution == 1:
        return {str(s.meta["method"]): s for s in state.rivals}
    out = {}
    for s in state.rivals:
        name = str(s.meta["method"])
        if name not in BASELINES or float(s.meta.get("search_seconds", 0)) * 3 > clock.left():
            continue  # a warm start has no generator; the rounded-up durations often take a baseline longer
        try:
            out[name] = BASELINES[name](p.units, n, p.limit)
        except (BaselineError, ScheduleError) as e:  # rounding up may push it over the limit
            log.info("baseline %s on the grid: %s", name, e)
    return out


def shift(s: Schedule) -> int:
    """Micro-batches one repetition of a schedule's kernel advances (at least 1)."""
    kernel = s.kernel()
    return max(1, kernel.shift) if kernel else 1
