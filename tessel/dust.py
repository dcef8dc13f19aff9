"""Float dust at memory events: a release that ends a hair after an allocation that follows it.

Rule 4 orders a device's memory events by their exact times (releases first only at equal
times). Start times computed by adding costs keep that order because a task that follows a
release starts at the very float the release's end is computed as. Two things break that: a
schedule whose starts are shifted (`Schedule.unroll` adds j periods to the repetend's tasks and
the cool-down's: `(s + jP) + d` and the float the follower was shifted to can differ in the last
bit), and Schedule.build's snap of a start next to an integer (a W at 26.99999999999999 stored
as 27 ends at 27.252, after the forward timed to start at 26.99999999999999 + 0.252). An
allocation then sorts a hair before the release it follows: over the limit by one activation.
`settle` moves each such release down by that hair (less than EPS, within rules 2 and 3's
tolerance), to the latest float that ends at or before the allocation, or, where snap would undo
that, the allocation up to the release's end: the events' order is the one the timing meant.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .key import Key
from .numeric import EPS, snap
from .placement import Number, Placement

if TYPE_CHECKING:
    from .schedule import Task


def settle(p: Placement, tasks: Sequence[Task]) -> dict[Key, Number]:
    """New starts for the tasks that break the order of a release and the allocation it is
    followed by a hair later (see the module doc); empty when none does. Starts as Schedule.build
    stores them (snapped): the new ones are left as snap leaves them."""
    if all(type(t.start) is int for t in tasks):
        return {}  # integer times: no dust
    by = p.by_id
    allocs: list[list[tuple[Number, Key]]] = [[] for _ in range(p.devices)]
    releases: list[tuple[Key, Number]] = []
    for task in tasks:
        key, t = (task.block, task.micro_batch), task.start
        mem = by[key[0]].memory
        if mem > 0:
            for d in by[key[0]].devices:
                allocs[d].append((t, key))
        elif mem < 0:
            releases.append((key, t))
    for a in allocs:
        a.sort()
    moved: dict[Key, Number] = {}
    for key, t in releases:
        blk = by[key[0]]
        end = t + blk.duration
        late = [x for d in blk.devices for x in _just_before(allocs[d], end)]
        if not late:
            continue
        down = _ending_by(min(a for a, _ in late), blk.duration)
        if down is not None:  # the release ends at or before the first of them
            moved[key] = down
        elif snap(end) == end:  # next to an integer: the allocations start where it ends instead
            moved.update((k, max(end, moved.get(k, end))) for _, k in late)
    return moved


def _just_before(allocs: list[tuple[Number, Key]], end: Number) -> list[tuple[Number, Key]]:
    """The allocations (sorted) that start within EPS before `end`."""
    i = bisect_left(allocs, (end - EPS,))
    out = []
    while i < len(allocs) and allocs[i][0] < end:
        out.append(allocs[i])
        i += 1
    return out


def _ending_by(at: Number, duration: Number) -> Number | None:
    """The latest start >= 0 that snap keeps and whose end, as the rules compute it, is <= `at`;
    None when there is none a few floats down (next to an integer snap would undo the step)."""
    t = snap(at - duration)
    for _ in range(8):
        if t + duration <= at:
            return t if t >= 0 else None
        down = math.nextafter(t, -math.inf)
        if snap(down) != down:
            return None
        t = down
    return None
