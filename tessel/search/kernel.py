"""Finding the repeating window (kernel) of a finished schedule, so Schedule.unroll can extend it.

A window [S, S + P) qualifies when it holds `shift` micro-batches' worth of tasks (one per
block and micro-batch) and every one of them recurs exactly one window later, `shift`
micro-batches on. The caller confirms with a real unroll that the tasks around it agree.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from itertools import accumulate

from ..key import Key


def kernel_starts(starts: Mapping[Key, int], micro_batches: int, blocks: int, period: int,
                  shift: int) -> Iterator[int]:
    """Candidate window starts S, earliest first."""
    items = sorted((s, k, b) for (b, k), s in starts.items())
    times = [s for s, _, _ in items]
    bad = [0] + list(accumulate(
        int(k + shift >= micro_batches or starts.get((b, k + shift)) != s + period) for s, k, b in items))
    size = shift * blocks
    seen = set()
    for i, s in enumerate(times):
        if s in seen:
            continue
        seen.add(s)
        j = bisect_left(times, s + period)
        if j - i != size or bad[j] - bad[i]:
            continue
        if bisect_left(times, s + 2 * period) - j == size:
            yield s
