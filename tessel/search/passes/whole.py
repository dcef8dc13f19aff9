"""Passes: the whole N-micro-batch problem in one solve, hinted by the best schedule so far:
a quick polish for few tasks (mode tessel), the same with the relaxation's cuts for up to
relax.GROUP_TASKS tasks (mode tessel, a schedule still well above the bound), and the proof
attempt of mode exact."""
from __future__ import annotations

import logging
from collections.abc import Callable

from ...errors import ScheduleError
from ...key import Key
from ...numeric import EPS
from ...placement import Number
from ...schedule import Schedule
from ...timing import earliest_starts, orders_from_starts, orders_of, schedule_from_orders
from .. import relax
from ..budget import Clock
from ..exact import solve_exact
from ..polish import in_order
from ..state import State
from .complete import grid_starts, sizes, with_kernel

log = logging.getLogger(__name__)
WHOLE_TASKS = 160  # up to this many tasks, tessel also improves the whole schedule in one solve


def whole(state: State, clock: Clock) -> None:
    """For few tasks (N the working N), one quick solve of the whole problem with a stall."""
    p, n, mod = state.problem, state.micro_batches, state.modulo
    if mod is None or clock.expired():
        return
    free, work = sizes(p, mod, n)
    if n != work or n * len(p.block_ids) > WHOLE_TASKS:
        return
    hint = grid_starts(p, state.best)
    if hint is None:
        return
    b = state.budget
    stall = b.completion_stall(max(free, default=1), len(p.block_ids))
    # a quick polish with a stall; asked to prove, a solve to the clock that also proves a bound
    res = solve_exact(p, n, clock if b.prove else clock.within(b.cap(stall, state.workers)), state.workers, hint,
                      stall=None if b.prove else stall)
    state.statuses["whole"] = res.status
    state.note_bound(res.status, res.bound)
    if state.best is None or not res.found or res.objective is None \
            or p.real(res.objective) >= state.best.makespan - EPS:
        return
    starts = res.starts()
    state.best = with_kernel(p, n, starts, [(mod.period, mod.copies)], "whole") \
        or with_kernel(p, n, starts, [], "whole") or state.best


def cuts(state: State, clock: Clock) -> None:
    """The whole problem with the releases, tails and micro-batch order as cuts: first probed
    from the proven bound up (relax.probe_starts, up to relax.PROBE_TASKS tasks, Budget.probe_share
    of the clock; beyond, up to relax.PROBE_TOP_TASKS, from the best schedule down; with
    Budget.probes_first, the default, the probes pass ran them earlier instead), then, up to
    relax.GROUP_TASKS tasks, one solve hinted by the best schedule with
    each block taking its micro-batches in order (relax.cut_starts); the orders either finds are
    replayed on the real durations. Under tight memory the period search's steady state and its
    completion leave the warm-up and cool-down to a few solves of their own, while this model sees
    every micro-batch at once: zbv, 8 devices, V-Min's memory, unit costs, latency 0.5: 143.5 ->
    133.5 (the optimum) at 24 micro-batches. The descent's work is set by the search's limit, not
    by the time left (the same schedule on a loaded machine, unless the clock cuts the solve)."""
    best, got = state.best, _inputs(state, clock)
    if got is None:
        return
    tasks, work, hint = got
    p, n, b = state.problem, state.micro_batches, state.budget
    if not b.probes_first:
        _probe(state, hint, clock.share(b.probe_share), work * b.probe_share)
    if tasks > relax.GROUP_TASKS or state.at_bound(True) or clock.expired():
        return
    if state.best is not best:  # the probes' schedule leads the descent
        if (again := _hint(state, state.best)) is None:
            return
        hint = again
    if not b.models(relax.event_pairs(p, n), clock, b.expand_per_pair):  # its presolve would overrun the clock
        log.info("cuts: no descent: expanding the reservoirs takes longer than the %.2fs left", clock.left())
        return
    found = relax.cut_starts(p, n, hint, state.lower_bound()[0], clock, state.workers, work * (1 - b.probe_share))
    state.statuses["cuts"] = "none" if found is None else "found"
    if found is not None:
        _replayed(state, found, "cuts")


def probes(state: State, clock: Clock) -> None:
    """With Budget.probes_first: the cuts' probes (relax.probe_starts) as a pass of their own,
    before the best baseline is completed like our own (whose solves can take the whole clock)."""
    got = _inputs(state, clock) if state.budget.probes_first else None
    if got is not None:
        _, work, hint = got
        _probe(state, hint, clock, work * state.budget.probe_share)


def _inputs(state: State, clock: Clock) -> tuple[int, float, dict[Key, Number]] | None:
    """What the cuts' probes and descent start from, when they may run: the task count, their work
    and the best schedule's hint."""
    p, n, best = state.problem, state.micro_batches, state.best
    tasks = relax.tasks(p.placement, n)
    if best is None or state.objective != "makespan" or clock.expired() or tasks > relax.PROBE_TOP_TASKS \
            or not state.affords(state.budget.own_builds):
        return None
    b = state.budget
    # its work: the reserve of a clock as long as the search's, at least Budget.cuts_least (a short
    # search's cuts run on what the passes before left), not the time left: the same every run
    work = b.cuts_work * max(b.cuts_reserve(state.clock.limit), b.cuts_least)
    hint = _hint(state, best)
    return None if hint is None else (tasks, work, hint)


def _hint(state: State, s: Schedule | None) -> dict[Key, Number] | None:
    """`s`'s starts with each block taking its micro-batches in order (polish.in_order), timed
    again: the relaxation's hint; None on a deadlock (DeadlockError)."""
    if s is None:
        return None
    try:
        return earliest_starts(state.problem.placement, state.micro_batches, in_order(orders_of(s)))
    except ScheduleError as e:
        log.info("cuts: no hint from the best schedule's orders: %s", e)
        return None


def _probe(state: State, hint: dict[Key, Number], clock: Clock, work: float) -> None:
    """relax.probe_starts from the search's proven bound to the hint's makespan (past
    relax.PROBE_TASKS tasks, halving down from the hint): a schedule it finds is replayed and
    offered, the bound its refuted horizons prove is the search's."""
    p, n = state.problem, state.micro_batches
    out = relax.probe_starts(p, n, hint, state.lower_bound()[0], clock, work,
                             top=relax.tasks(p.placement, n) > relax.PROBE_TASKS)
    state.prove(out.bound, "probe")
    state.statuses["probe"] = "none" if out.starts is None else "found"
    if out.starts is not None:
        _replayed(state, out.starts, "probe")


def _replayed(state: State, starts: dict[Key, int], base: str) -> None:
    """The relaxation's per-device orders replayed on the real durations, kept when shorter (none
    when they break rule 4: the relaxation counts a device's events at one time together)."""
    p, n = state.problem, state.micro_batches
    try:
        state.offer(schedule_from_orders(p.placement, n, orders_from_starts(p.placement, starts), p.real_limit(),
                                         None, {"base": base}))
    except ScheduleError as e:
        log.info("%s: no valid schedule from the relaxation's orders: %s", base, e)


def hinted(passes: Callable[[State, Clock], None]) -> Callable[[State, Clock], None]:
    """Mode exact's first pass: `passes` (tessel's) on a state of their own over the clock
    given, whose schedule then hints the whole-problem solve."""
    def run(state: State, clock: Clock) -> None:
        if state.start is None:
            return
        sub = State(state.problem, state.micro_batches, clock, state.workers, state.progress, state.budget,
                    state.objective, rivals=state.rivals, raced=state.raced, start=state.start)
        passes(sub, clock)
        state.statuses.update(hint=sub.statuses)
        state.repetend, state.modulo, state.best = sub.repetend, sub.modulo, sub.best
    return run


def exact(state: State, clock: Clock) -> None:
    """One solve of everything (a proof when it ends in time), hinted by the best so far."""
    p, n = state.problem, state.micro_batches
    if state.best is None or state.modulo is None:
        return
    if not state.budget.models(n * len(p.block_ids), clock):
        log.info("exact: a model of %d tasks takes longer to build than the %.1fs left", n * len(p.block_ids),
                 clock.left())
        state.statuses["exact"] = "unknown"
        return
    out = solve_exact(p, n, clock, state.workers, grid_starts(p, state.best), state.progress)
    state.statuses["exact"] = out.status
    state.note_bound(out.status, out.bound)
    if out.found and out.objective is not None and p.real(out.objective) < state.best.makespan - EPS:
        state.best = p.schedule(n, out.starts(), None, None, {"base": "exact"})
