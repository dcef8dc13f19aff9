"""Pass: the end. The schedule is replayed on the real durations (order kept), so rounding
durations up to the integer grid costs nothing against a baseline, then the best of it and
the raced baselines is kept; `summary` is the report of the search (report.py)."""
from __future__ import annotations

import logging

from ... import baselines, bounds
from ...numeric import EPS, rounded
from ...placement import Number
from ...schedule import Repetend, Schedule, ScheduleError
from ...timing import orders_of, schedule_from_orders
from ..budget import Clock
from ..modulo import steady_memory
from ..report import SearchReport
from ..state import State, per_micro_batch
from .rivals import shift

log = logging.getLogger(__name__)


def final(state: State, clock: Clock) -> None:
    """The best schedule replayed on the real durations (never longer, same memory order), then
    the best of it and the baselines by the objective."""
    s = state.best
    if s is not None and not state.problem.exact_time and state.affords(2):  # a replay and a check
        s = _compacted(s)
    ranked = sorted(state.rivals, key=state.value)  # stable: the first of equals, as raced
    best = s if s is not None else ranked[0]
    if ranked and state.value(ranked[0]) < state.value(best) - EPS:
        best = ranked[0]
    if best is not s:  # a raced baseline won (or nothing else was needed: it met the bound)
        best = _with_repetend(state, best, clock).with_meta(base=str(best.meta.get("method")))
    state.best = best


def _with_repetend(state: State, rival: Schedule, clock: Clock) -> Schedule:
    """A raced baseline that won, with its repetend (so it unrolls) when the clock allows the few
    builds that takes; as raced otherwise."""
    if str(rival.meta.get("method")) not in baselines.BASELINES:  # a warm start: no generator to rebuild it
        return rival
    if clock.left() < state.budget.repetend_builds * float(rival.meta.get("search_seconds", 0)):
        log.info("baseline %s kept without its repetend: no time left to find it", rival.meta.get("method"))
        return rival
    return baselines.with_repetend(rival)


def _compacted(s: Schedule) -> Schedule:
    """Every device's order as early as the real durations allow; the repetend kept where the
    replayed kernel still unrolls."""
    try:
        tight = schedule_from_orders(s.placement, s.micro_batches, orders_of(s), s.memory_limit, None, s.meta)
    except ScheduleError as e:  # floating point: a release summed to just after an allocation at its time
        log.info("no real-time compaction: %s", e)
        return s
    if tight.makespan >= s.makespan - EPS:
        return s
    rep = s.repetend
    if rep is None:
        return tight
    first = min((t for t in s.tasks if t.start >= rep.start - EPS), key=lambda t: (t.start, t.micro_batch, t.block))
    at = tight.start[(first.block, first.micro_batch)]
    kept = Schedule.build(tight.placement, tight.micro_batches, tight.start, tight.memory_limit,
                          Repetend(rep.period, at, at + rep.period), tight.meta, check=False)
    try:
        kept.unroll(kept.micro_batches + shift(kept))
    except ScheduleError as e:
        log.info("the compacted schedule keeps no repetend: %s", e)
        return tight.with_meta(repetend="none")
    return kept


def summary(state: State, mode: str) -> SearchReport:
    """What the search says about how it got state.best (SearchReport)."""
    p, s, mod, res = state.problem, state.best, state.modulo, state.repetend
    assert s is not None, "a search ends with a schedule"
    lb, source = state.lower_bound()
    value = state.value(s)
    undecided = tuple(sorted({_num(p.real(t) / c) for c, t in res.undecided})) if res is not None else ()
    status = "optimal" if value <= lb + EPS else ("time_limit" if state.clock.expired() else "feasible")
    limit = p.real_limit()
    period = per_micro_batch(p, mod) if mod is not None else _kernel_period(s)
    return SearchReport(
        method=mode, objective=state.objective, status=status, base=str(s.meta.get("base", "repetend")),
        lower_bound=_num(lb), bound_source=source, gap=round(value / lb - 1, 4) if lb > 0 else 0.0,
        search_seconds=round(state.clock.elapsed(), 3),
        period=period, repetend_micro_batches=1 if mod is None else mod.copies,
        period_optimal=bool(res.period_optimal) if res is not None else bool(
            period is not None and period <= float(p.period_floor) * float(p.resolution) + EPS),
        periods_undecided=undecided,
        period_lower_bound=bounds.period_lower_bound(p.placement),
        period_memory_bound=round(float(p.memory_period_bound) * p.resolution, 6),
        span=None if mod is None else p.real(mod.span(p)), in_flight=None if mod is None else mod.in_flight(p),
        steady_memory=() if mod is None or limit is None else tuple(
            x / p.memory_scale if p.memory_scale > 1 else x for x in steady_memory(p, mod)),
        resolution=p.resolution, exact_time=p.exact_time, statuses=dict(state.statuses),
        seconds={**state.seconds, "total": round(state.clock.elapsed(), 3)})


def _kernel_period(s: Schedule) -> Number | None:
    """A raced baseline's period per micro-batch (its repetend over the micro-batches it advances)."""
    if s.repetend is None:
        return None
    return _num(s.repetend.period / shift(s))


def _num(x: Number) -> Number:
    return rounded(x, 6)
