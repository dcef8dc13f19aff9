"""Find the steady state of a deterministic schedule builder, so that `Schedule.unroll` works.

A baseline's schedule for N + k micro-batches is its schedule for N with one period inserted,
when its steady state repeats every k micro-batches. The period T is the makespan difference;
the window [c, c + T) is one that, repeated by `unroll`, gives exactly the schedule the builder
makes for N + k and N + 2k. Nothing is assumed: a window is kept only when that check passes.
"""
from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import replace

from ..schedule import EPS, Repetend, Schedule, ScheduleError, unroll

log = logging.getLogger(__name__)
TRIES = 24


def _same(a: Schedule, b: Schedule) -> bool:
    sa, sb = a.start, b.start
    return sa.keys() == sb.keys() and all(abs(sa[k] - sb[k]) <= 1e-6 for k in sa)


def detect(make: Callable[[int], Schedule], n: int, shift: int) -> Repetend | None:
    """The repetend of `make(n)` checked against `make(n + shift)` and `make(n + 2 * shift)`."""
    base, one, two = make(n), make(n + shift), make(n + 2 * shift)
    period = one.makespan - base.makespan
    if period <= EPS or abs(two.makespan - one.makespan - period) > EPS:
        return None
    starts = sorted(t.start for t in base.tasks)
    want = shift * len(base.placement.blocks)
    middle = base.makespan / 2
    for c in sorted(set(starts), key=lambda x: abs(x - middle))[:TRIES]:
        if bisect.bisect_left(starts, c + period - EPS) - bisect.bisect_left(starts, c - EPS) != want:
            continue
        rep = Repetend(period, c, c + period)
        cand = replace(base, repetend=rep)
        try:
            if _same(unroll(cand, n + shift, False), one) and _same(unroll(cand, n + 2 * shift, False), two):
                return rep
        except ScheduleError:
            continue
    log.info("no repetend found at %d micro-batches (shift %d)", n, shift)
    return None


def window_holds(a: Schedule, b: Schedule, rep: Repetend) -> bool:
    """Whether `a` and `b` run the same tasks at the same times inside the repetend's window."""
    def inside(s: Schedule) -> set[tuple[str, int, float]]:
        kernel = s.kernel(rep)
        assert kernel is not None
        return {(t.block, t.micro_batch, round(t.start, 6)) for t in kernel.tasks}
    return inside(a) == inside(b)
