"""A line placement's own construction for the search alone: 1F1B's forward and backward orders,
the W passes placed as the walk goes (baselines.wfill), the shortest a first answer and a polish seed.

On `zb` (stage r on device r, each backward split into B and W) under ZB-H1's memory (p
activations on every device) with profiled costs, the period search's repetend runs at the load
bound but its completion ends 2-3.5% above the zero-bubble repository's automatic scheduler,
which meets the proven bound (p = 16, 32 micro-batches: 104.968 against 101.44; 104.024 with 90
s): its warm-up fills each device with as many forwards as the limit holds, so the backwards come
back up the line late and device 0 waits for them. The line's own shape avoids that: device r
runs p - r forwards (1F1B's warm-up, which the first backward's round trip asks for), then one
backward, one forward, each W right after its B in the order; the walk then holds W passes back
into the bubbles or until a forward needs their memory, which is ZB-H1's idea, here from the
placement alone. Each device's warm-up is also tried up to WARM_STEPS forwards deeper where its
limit holds them (slack for latency), and shallower where the limit does not hold 1F1B's.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from ..baselines.shapes import BaselineError, Chain, one_f_one_b, single_chain
from ..baselines.wfill import fill_weights
from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import DeadlockError, earliest_starts, order_peak, span
from .vbuild import TIMINGS  # the same walks as the V's

log = logging.getLogger(__name__)
WARM_STEPS = (0, 1, 2)  # forwards beyond 1F1B's warm-up on each device, where its limit holds them


def line_chain(p: Placement) -> Chain | None:
    """The pipeline chain of a line placement (stage r alone on device r, a backward per stage), else None."""
    try:
        c = single_chain(p, "the line construction")
    except BaselineError:
        return None
    if not c.backward or [c.device(p, f) for f in c.forward] != list(range(p.devices)):
        return None
    return c


def line_construction(p: Placement, n: int, limit: Sequence[Number] | None,
                      deadline: float = math.inf) -> dict[Key, Number] | None:
    """Start times of the shortest line construction of `n` micro-batches under `limit` (module
    doc); None when `p` is not a line or no variant fits. Variants after the first are tried by
    the time.perf_counter() `deadline` only."""
    c = line_chain(p)
    if c is None:
        return None
    late = set(c.weight.values())
    best: tuple[Number, dict[Key, Number]] | None = None
    seen: set[tuple[tuple[Key, ...], ...]] = set()
    for i, step in enumerate(WARM_STEPS):
        if i and time.perf_counter() > deadline:
            break
        orders = _fitting(p, c, n, limit, step)
        if orders is None or (frozen := tuple(map(tuple, orders))) in seen:
            continue
        seen.add(frozen)
        early = [[x for x in o if x[0] not in late] for o in orders]  # the W walk places the rest
        for reorder, slack in TIMINGS:
            starts = fill_weights(p, early, c.weight, limit, reorder=reorder, slack=slack)
            if starts is None:
                continue
            length = span(p, starts)
            if best is None or length < best[0] - EPS:
                best = length, starts
    log.info("line construction: %s", None if best is None else best[0])
    return None if best is None else best[1]


def _fitting(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None, step: int) -> list[list[Key]] | None:
    """Every device's order with the deepest warm-up up to 1F1B's + `step` that fits its limit;
    None when a device fits none or the orders deadlock."""
    k = p.devices
    orders = []
    for r in range(k):
        deepest = (line_order(c, k, r, n, w) for w in range(min(k - r + step, n), 0, -1))
        order = next((o for o in deepest if limit is None or order_peak(p, o) <= limit[r] + EPS), None)
        if order is None:
            return None
        orders.append(order)
    try:
        earliest_starts(p, n, orders)
    except DeadlockError:
        return None
    return orders


def line_order(c: Chain, k: int, r: int, n: int, warm: int) -> list[Key]:
    """Device r's order: `warm` forwards, then a backward and a forward each, each W right after its B."""
    f, b = c.forward[r], c.backward[k - 1 - r]  # stage r's backward is the (k-1-r)-th on the way back
    order = one_f_one_b([(f, m) for m in range(n)], [(b, m) for m in range(n)], warm - 1)
    return [y for x in order for y in ([x, (c.weight[x[0]], x[1])] if x[0] in c.weight else [x])]
