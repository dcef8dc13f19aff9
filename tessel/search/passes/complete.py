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
from ..completion import compact, complete, makespan, plain_unroll
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
    """state.modulo completed and unrolled to N: the first best schedule of the search."""
    if state.modulo is not None:
        state.best = completed(state, state.modulo, clock)


def deepest_repetend(state: State, clock: Clock) -> None:
    """The deepest repetend at the period found (Budget.deep_share of the clock), completed on
    what is left; it replaces the best when shorter."""
    mod, p = state.modulo, state.problem
    if mod is None or state.at_bound():  # already at the proven bound: nothing to gain
        return
    deep = deepest(p, mod, clock.share(state.budget.deep_share), state.workers,
                   state.budget.repetend_stall(len(p.block_ids)))
    if deep is not None and deep.in_flight(p) > mod.in_flight(p) and not clock.expired():
        if state.offer(completed(state, deep, clock, "completion_deep")):
            state.modulo = deep


def completed(state: State, mod: Modulo, clock: Clock, phase: str = "completion") -> Schedule:
    """The repetend completed (warm-up and cool-down solves with a stall each, compaction) and
    unrolled to N; a round stopped on a stall goes again Budget.patience times more patiently
    when the clock allows."""
    p, n, b = state.problem, state.micro_batches, state.budget
    free, work = sizes(p, mod, n)
    stall = b.completion_stall(free[-1], len(p.block_ids))
    plain = compact(p, work, plain_unroll(mod, work))
    done = complete(p, plain, work, free, clock, state.workers, stall, p.lower_bound(work))
    statuses = list(done.statuses)
    first = done.starts
    if makespan(p, first) > p.lower_bound(work) and clock.left() > b.patience * stall.seconds * 2 * len(free):
        # a solve stopped on a stall is at the mercy of the machine's load: go again, more patiently
        done = complete(p, first, work, free, clock, state.workers, stall.times(b.patience), p.lower_bound(work))
        statuses += done.statuses
    state.statuses[phase] = statuses
    s = _own(state, mod, work, [done.starts, first, plain])
    state.report(phase=phase, makespan=s.makespan, period=per_micro_batch(p, mod))
    return s


def sizes(p: Problem, mod: Modulo, n: int) -> tuple[list[int], int]:
    """The counts of micro-batches freed at each end in turn, and the working N: enough
    micro-batches for a steady state between warm-up and cool-down (and N minus it a multiple
    of the repetend's micro-batches, so it unrolls to N), or N itself when smaller."""
    g, copies = mod.in_flight(p), mod.copies
    most = max(1, min(copies * (g + 1), FREE_MICRO_BATCHES, FREE_TASKS // len(p.block_ids), n // 2))
    free = sorted({min(3, most), most})
    work = 2 * most + copies * (2 * g + 2)
    if work >= n:
        return free, n
    return free, work + (n - work) % copies


def _own(state: State, mod: Modulo, work: int, candidates: list[dict[Key, int]]) -> Schedule:
    """The shortest completed schedule whose steady state repeats (it unrolls to N); when N is
    the working N, a shorter one without a kernel is taken too."""
    p, n = state.problem, state.micro_batches
    ranked = sorted(candidates, key=lambda st: makespan(p, st)) + [plain_unroll(mod, work)]
    s = None
    for starts in ranked:
        s = with_kernel(p, work, starts, [(mod.period, mod.copies)], "repetend")
        if s is not None:
            break
        if n == work:
            s = with_kernel(p, work, starts, [], "repetend")
            break
    assert s is not None, "the plain unroll always repeats"
    return s.unroll(n) if n > work else s


def with_kernel(p: Problem, n: int, starts: Mapping[Key, int], kernels: Sequence[tuple[int, int]],
                base: str) -> Schedule | None:
    """The real schedule with the first kernel (period, shift) a real unroll confirms; with no
    kernels asked for, the schedule without one; else None."""
    if not kernels:
        return p.schedule(n, starts, None, None, {"base": base, "repetend": "none"})
    for period, shift in kernels:
        for i, start in enumerate(kernel_starts(starts, n, len(p.block_ids), period, shift)):
            if i >= KERNEL_TRIES:
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
