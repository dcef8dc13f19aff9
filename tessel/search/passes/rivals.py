"""Pass: the best baseline on the grid, compacted and completed like our own repetend, when it
beats our own (the search never returns a schedule longer than a baseline that ran)."""
from __future__ import annotations

import logging
from collections.abc import Sequence

from ...baselines import BASELINES, BaselineError
from ...schedule import Schedule, ScheduleError
from ..budget import Clock
from ..completion import compact, complete, makespan
from ..problem import Problem
from ..state import State
from .complete import sizes, with_kernel

log = logging.getLogger(__name__)


def completed_baseline(state: State, clock: Clock) -> None:
    p, n, mod, own = state.problem, state.micro_batches, state.modulo, state.best
    if mod is None or own is None or not state.affords(state.budget.own_builds):
        return
    got = grid_baseline(p, n, state.rivals, clock, state.budget.grid_rivals)
    if got is None or clock.expired():
        return
    name, base = got
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


def grid_baseline(p: Problem, n: int, rivals: Sequence[Schedule], clock: Clock,
                  most: int = 1) -> tuple[str, Schedule] | None:
    """The best raced baseline on the grid placement: the real schedules when the grid is exact,
    else, in order of real makespan, the first `most` (0: all) that run again on the grid's
    (rounded-up) durations, the shortest of those. Only the best is completed: running all of them
    again took 2.4 s of a 15 s search on zbv, 8 devices, 16 micro-batches, V-Min's memory, time the
    cuts' solve could use. On 40 open rows of the peers grid at 20 s (bench/results/grid-rivals.md,
    Budget.grid_rivals 1 against 0) the makespans stay: 3 shorter, 1 longer by 0.66% (a row an
    earlier run of the same pair had the other way), geometric mean 1.0001."""
    ranked = sorted(rivals, key=lambda s: s.makespan)
    if p.exact_time and p.resolution == 1:
        return (str(ranked[0].meta["method"]), ranked[0]) if ranked else None
    out: dict[str, Schedule] = {}
    for s in ranked:
        if most and len(out) >= most:
            break
        name = str(s.meta["method"])
        if name not in BASELINES or float(s.meta.get("search_seconds", 0)) * 3 > clock.left():
            continue  # a warm start has no generator; the rounded-up durations often take a baseline longer
        try:
            out[name] = BASELINES[name](p.units, n, p.limit)
        except (BaselineError, ScheduleError) as e:  # rounding up may push it over the limit
            log.info("baseline %s on the grid: %s", name, e)
    return min(out.items(), key=lambda kv: kv[1].makespan, default=None)


def shift(s: Schedule) -> int:
    """Micro-batches one repetition of a schedule's kernel advances (at least 1)."""
    kernel = s.kernel()
    return max(1, kernel.shift) if kernel else 1
