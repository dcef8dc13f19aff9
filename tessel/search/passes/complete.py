"""Passes: completion, warm-up and cool-down around the repetend for N micro-batches, on the
least-span repetend and on the deepest one at the same period (repetend.deepest: the most
memory-time the limits allow, so more micro-batches in flight where a device has room);
compaction then fills the warm-up and drains the cool-down through the deeper pattern (ZB-H2's
shape on `zb`, found, not copied). The shorter one is kept.

Completion runs on a working number of micro-batches big enough for a steady state (or N itself
when N is smaller); larger N is reached by Schedule.unroll, so the search costs the same for 100
or 10,000 micro-batches.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ...key import Key
from ...schedule import Schedule, ScheduleError
from ..budget import Clock
from ..completion import MIN_WORK, Completed, compact, complete, makespan, plain_unroll
from ..kernel import kernel_starts
from ..modulo import Modulo
from ..problem import Problem
from ..repetend import deepest
from ..state import State, per_micro_batch

log = logging.getLogger(__name__)
FREE_TASKS = 800  # most tasks one completion solve frees at each end
FREE_MICRO_BATCHES = 6  # and most micro-batches
KERNEL_TRIES = 8  # window starts checked by a real unroll before giving up on a candidate


def completion(state: State, clock: Clock) -> None:
    """state.modulo completed and unrolled to N: the first best schedule of the search; left
    out when a raced baseline is in hand and the clock cannot hold Budget.own_builds builds."""
    if state.modulo is None:
        return
    if state.rivals and not state.affords(state.budget.own_builds):
        log.info("completion skipped: %d tasks do not fit the clock left; the raced baselines stand",
                 state.micro_batches * len(state.problem.block_ids))
        return
    state.best = completed(state, state.modulo, clock)


def deepest_repetend(state: State, clock: Clock) -> None:
    """The deepest repetend at the period found (Budget.deep_share of the period search's work,
    from the search's limit: the same on a loaded machine; the wall clock only a safety net),
    completed on what is left; it replaces the best when shorter."""
    mod, p, b = state.modulo, state.problem, state.budget
    if mod is None or state.at_bound():  # already at the proven bound: nothing to gain
        return
    stall = b.repetend_stall(len(p.block_ids))
    work = b.period_work(state.clock.limit) * b.deep_share
    if work < float("inf"):
        stall = stall.within(work)
        wall = clock.within(stall.work * b.work_wall * b.slice_wall)
    else:  # asked to prove: a share of the time left, as it was
        wall = clock.share(b.deep_share)
    deep = deepest(p, mod, wall.within(b.cap(stall, state.workers)), state.workers, stall)
    if deep is not None and deep.in_flight(p) > mod.in_flight(p) and not clock.expired() \
            and state.affords(state.budget.own_builds):
        if state.offer(completed(state, deep, clock, "completion_deep")):
            state.modulo = deep


def completed(state: State, mod: Modulo, clock: Clock, phase: str = "completion") -> Schedule:
    """The repetend completed (warm-up and cool-down solves with a stall each, compaction) and
    unrolled to N; a round stopped on a stall goes again Budget.patience times more patiently
    while the solves' budget of deterministic work (Budget.completion_work) lasts."""
    p, n, b = state.problem, state.micro_batches, state.budget
    free, work = sizes(p, mod, n)
    stall = b.completion_stall(max(free, default=1), len(p.block_ids))
    raw = plain_unroll(mod, work)
    # the plain unroll is valid as it is: compaction only when the clock holds the builds that follow
    plain = compact(p, work, raw) if state.affords(b.own_builds, work) else raw
    # answer first: no solve once the proven bound is met (none to bound without an end to free:
    # the bound of a working N that is not N walks every device's tasks, seconds at 1,024 devices)
    bound = state.grid_bound(work) if free else 0
    cap = b.cap(stall, state.workers)
    # the solves' work is set by the search's limit, not by the time left (which the load decides)
    budget = b.completion_work(state.clock.limit)
    # no end to free (blocks over FREE_TASKS): the compacted unroll is the completion
    done = complete(p, plain, work, free, clock, state.workers, stall, bound, cap, budget) if free \
        else Completed(plain, (), 0.0)
    statuses = list(done.statuses)
    first = done.starts
    if free and makespan(p, first) > bound and budget - done.work > MIN_WORK:
        # a round stopped on its stalls: again, more patiently, on the work the budget has left
        done = complete(p, first, work, free, clock, state.workers, stall.times(b.patience), bound,
                        cap * b.patience, budget - done.work)
        statuses += done.statuses
    state.statuses[phase] = statuses
    s = _own(state, mod, work, [done.starts, first, plain], raw)
    state.report(phase=phase, makespan=s.makespan, period=per_micro_batch(p, mod))
    return s


def sizes(p: Problem, mod: Modulo, n: int) -> tuple[list[int], int]:
    """The counts of micro-batches freed at each end in turn, and the working N: enough
    micro-batches for a steady state between warm-up and cool-down (and N minus it a multiple
    of the repetend's micro-batches, so it unrolls to N), or N itself when smaller. No solve
    when one micro-batch alone has more than FREE_TASKS tasks: compaction only."""
    g, copies = mod.in_flight(p), mod.copies
    most = max(1, min(copies * (g + 1), FREE_MICRO_BATCHES, FREE_TASKS // len(p.block_ids), n // 2))
    free = sorted({min(3, most), most}) if len(p.block_ids) <= FREE_TASKS else []
    work = 2 * most + copies * (2 * g + 2)
    if work >= n:
        return free, n
    return free, work + (n - work) % copies


def _own(state: State, mod: Modulo, work: int, candidates: list[dict[Key, int]], raw: dict[Key, int]) -> Schedule:
    """The shortest completed schedule whose steady state repeats (it unrolls to N); when N is
    the working N, a shorter one without a kernel is taken too. `raw` is the plain unroll."""
    p, n = state.problem, state.micro_batches
    unique = list({id(c): c for c in candidates}.values())  # without solves they are one dict
    ranked = sorted(unique, key=lambda st: makespan(p, st)) + [raw]
    tries = KERNEL_TRIES if not state.clock.expired() else 1  # each try builds the whole schedule
    if not state.affords(2, work):  # a try builds and unrolls it: none when the clock cannot hold one
        tries = 0
    s = None
    for starts in ranked:
        s = with_kernel(p, work, starts, [(mod.period, mod.copies)], "repetend", tries)
        if s is not None:
            break
        if n == work:
            s = with_kernel(p, work, starts, [], "repetend")
            break
    if s is None:  # out of time before a window was confirmed (the plain unroll's repeats)
        s = with_kernel(p, work, ranked[-1], [], "repetend")
        assert s is not None, "a schedule without a kernel is always built"
        if n > work:
            return with_kernel(p, n, plain_unroll(mod, n), [], "repetend") or s
    return s.unroll(n) if n > work else s


def with_kernel(p: Problem, n: int, starts: Mapping[Key, int], kernels: Sequence[tuple[int, int]],
                base: str, tries: int = KERNEL_TRIES) -> Schedule | None:
    """The real schedule with the first kernel (period, shift) a real unroll confirms; with no
    kernels asked for, the schedule without one; else None."""
    if not kernels:
        return p.schedule(n, starts, None, None, {"base": base, "repetend": "none"})
    if tries <= 0:
        return None
    for period, shift in kernels:
        for i, start in enumerate(kernel_starts(starts, n, len(p.block_ids), period, shift)):
            if i >= tries:
                break
            s = p.schedule(n, starts, (start, start + period), period, {"base": base})
            try:
                s.unroll(n + shift)
                return s
            except ScheduleError as e:
                log.info("kernel at %s does not unroll: %s", start, e)
    return None


def grid_starts(p: Problem, s: Schedule | None) -> dict[Key, int] | None:
    """The schedule's starts on the grid, when they are grid times."""
    if s is None:
        return None
    out = {}
    for t in s.tasks:
        x = t.start / p.resolution
        if abs(x - round(x)) > 1e-6:
            return None
        out[(t.block, t.micro_batch)] = int(round(x))
    return out
