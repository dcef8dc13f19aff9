"""Passes: the repetend. Mode tessel searches the period (repetend.py) and gives the periods it
left undecided a second chance; mode fast polishes a construction at the bound."""
from __future__ import annotations

import math
import time

from ..budget import Clock
from ..fast import constructions
from ..modulo import fits
from ..repetend import RepetendResult, find_repetend, modulo_of, retry_undecided, solve_period
from ..state import State


def period_search(state: State, clock: Clock) -> None:
    """The smallest period per micro-batch from state.start down to the bound (tessel)."""
    if state.start is None:
        return
    p = state.problem
    state.report(phase="repetend", period=p.real(p.period_bound))
    # its work is set by the search's limit, not by the time left (which the load decides)
    res = find_repetend(p, clock, state.workers, state.progress, state.start, state.budget,
                        state.budget.period_work(state.clock.limit))
    _keep(state, res)


def retry(state: State, clock: Clock) -> None:
    """The periods the period search left undecided, with more work on the clock it left."""
    if state.repetend is None or not state.repetend.undecided:
        return
    _keep(state, retry_undecided(state.problem, state.repetend, clock, state.workers, state.budget))


def _keep(state: State, res: RepetendResult) -> None:
    p = state.problem
    state.repetend, state.modulo = res, res.modulo
    state.statuses["repetend"] = res.status
    state.statuses["periods_tried"] = [[c, p.real(t), st] for c, t, st in res.tried]


def polish(state: State, clock: Clock) -> None:
    """Constructed repetends at the bound, the solver polishing the best one's span (which
    also repairs memory when no construction fits there), else state.start is kept (fast).
    A construction that fits gets Budget.polish_share of the clock (at most polish_cap
    seconds); a repair gets repair_share."""
    if state.start is None:
        return
    p, b, start, t0 = state.problem, state.budget, state.start, time.perf_counter()
    lb = math.ceil(p.period_floor)
    state.report(phase="construct", period=p.real(lb))
    at_bound = constructions(p, lb, clock.deadline) if start.period > lb else [start]  # none past the clock
    fitting = [m for m in at_bound if fits(p, m)]
    hint = (fitting or at_bound)[0] if fitting or at_bound else None
    state.report(phase="polish", period=p.real(lb))
    limit = clock.share(b.polish_share).within(b.polish_cap) if fitting else clock.share(b.repair_share)
    res = solve_period(p, lb, limit, state.workers, hint, state.progress,
                       stall=b.repetend_stall(len(p.block_ids)))
    state.statuses["polish"] = res.status
    mod, by = start, "construction"
    if res.found and (not fitting or res.objective is None or res.objective <= fitting[0].span(p)):
        mod, by = modulo_of(res.values, p, lb), "solver"
    elif fitting:
        mod = fitting[0]
    optimal = mod.per_micro_batch == p.period_floor
    state.repetend = RepetendResult(mod, by, res.status, optimal, ((1, lb, res.status),), (),
                                    time.perf_counter() - t0)
    state.modulo = mod
