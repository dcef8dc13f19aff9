"""A V placement's own construction for the search alone: per-device orders read off the V's
structure, timed on the real costs and latency, the shortest a first answer and a polish seed.

On `zbv` (device r holds stage r, chunk 0, and stage 2p-1-r, chunk 1) the period search's
repetends complete 2-13% above the V generators people use once costs are fractional and
latency counts (p = 6, profiled costs, latency 0.032, 12 micro-batches: 33.8 against ZB-V's
33.06), and the order polish cannot move a completion that far. What it misses is the shape of
a V, which follows from the placement alone:

- forwards: a micro-batch's chunk-1 forward reaches device r a round trip after its chunk-0
  one (down to the turn on device p-1 and back: R = 2(p-r)-1 chunk forwards), so the device
  runs R chunk-0 forwards first, then alternates chunk 1 and chunk 0 until its warm-up of
  `warm` forwards is done; after it chunk 1 catches up until it is `lead` micro-batches behind
  chunk 0, then the two alternate (a slot with no forward left stays empty: the backwards keep
  their pace);
- backwards: chunk 1's come first (the loss is on device 0's chunk 1), `lag` of them before
  chunk 0's first, then the two alternate;
- one forward, one backward after the warm-up (1F1B), each W right after its B until the last
  forward; the cool-down's W passes fill the bubbles (baselines.wfill's walk, nothing reordered
  unless asked: a W run where a B waits for its input ends the device sooner; the cool-down split
  as baselines.zbv_hand does it).

`warm` 2p-1, `lead` p-r-1 and `lag` p-r keep 2p chunk activations on every device (1F1B's
memory); the family tries each one step up (more slack for latency where memory allows; the
order's peak with each W after its B bounds the walk's) and both timings, and keeps the
shortest. Orders that deadlock are dropped (a replay finds them), so no walk waits for ever.
Eight variants, a replay and three walks each: 0.4 s at p = 6, N = 24 and 1 s at p = 8, N = 32
on 2 cores at load 11.
"""
from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence

from ..baselines.shapes import BaselineError, Chain, single_chain
from ..baselines.wfill import fill_weights
from ..baselines.zbv_hand import _cool_down_free
from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import DeadlockError, earliest_starts, order_peak, span

log = logging.getLogger(__name__)
STEPS = (0, 1)  # each of warm, lead and lag at the V's own value and one step up
TIMINGS = ((False, 0.0), (True, 0.0), (False, 0.5))  # wfill's (reorder, slack): W passes as listed, or moved


def v_chain(p: Placement) -> Chain | None:
    """The pipeline chain of a V placement (stage k on device k, stage 2p-1-k back on it), else None."""
    try:
        c = single_chain(p, "the V construction")
    except BaselineError:
        return None
    k = p.devices
    if len(c.forward) != 2 * k or not c.backward:
        return None
    if [c.device(p, f) for f in c.forward] != [*range(k), *reversed(range(k))]:
        return None
    return c


def v_construction(p: Placement, n: int, limit: Sequence[Number] | None,
                   deadline: float = math.inf) -> dict[Key, Number] | None:
    """Start times of the shortest V construction of `n` micro-batches under `limit` (module
    doc); None when `p` is not a V or no variant fits. Variants tried by the
    time.perf_counter() `deadline` only (the first always)."""
    c = v_chain(p)
    if c is None:
        return None
    best: tuple[Number, dict[Key, Number]] | None = None
    for i, (dw, dl, dg) in enumerate(itertools.product(STEPS, repeat=3)):
        if i and time.perf_counter() > deadline:
            break
        orders = _fitting(p, c, n, limit, dw, dl, dg)
        if orders is None:
            continue
        for reorder, slack in TIMINGS:
            starts = fill_weights(p, [_cool_down_free(c, o) for o in orders], c.weight, limit,
                                  reorder=reorder, slack=slack)
            if starts is not None and (best is None or span(p, starts) < best[0] - EPS):
                best = span(p, starts), starts
    log.info("V construction: %s", None if best is None else best[0])
    return None if best is None else best[1]


def _fitting(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None,
             dw: int, dl: int, dg: int) -> list[list[Key]] | None:
    """Every device's order (each W right after its B) of the variant stepped up by (dw, dl, dg);
    None when one deadlocks or goes over its device's limit."""
    k = p.devices
    orders: list[list[Key]] = [[] for _ in range(k)]
    for r in range(k):
        orders[r] = v_order(c, k, r, n, 2 * k - 1 + dw, k - r - 1 + dl, k - r + dg)
        if limit is not None and order_peak(p, orders[r]) > limit[r] + EPS:
            return None
    try:
        earliest_starts(p, n, orders)
    except DeadlockError:
        return None
    return orders


def v_order(c: Chain, k: int, r: int, n: int, warm: int, lead: int, lag: int) -> list[Key]:
    """Device r's order of the V's forwards and backwards, each W right after its B (module doc)."""
    size = len(c.forward)
    f0, f1 = c.forward[r], c.forward[size - 1 - r]
    b1, b0 = c.backward[r], c.backward[size - 1 - r]  # stage s's backward is c.backward[size - 1 - s]
    fwd = _forwards(f0, f1, n, 2 * (k - r) - 1, warm, lead)
    bwd = [(b1, m) if b == 1 else (b0, m) for b, m in _two(n, lag)]
    w = min(warm, len(fwd))
    order = fwd[:w]
    for i in range(len(fwd) - w):
        order += [fwd[w + i], bwd[i] if i < len(bwd) else None]
    out = [x for x in order + list(bwd[len(fwd) - w:]) if x is not None]
    return [y for x in out for y in ([x, (c.weight[x[0]], x[1])] if x[0] in c.weight else [x])]


def _forwards(f0: str, f1: str, n: int, trip: int, warm: int, lead: int) -> list[Key | None]:
    """The device's forwards in order, None for a slot left empty (chunk 0's are done)."""
    out: list[Key | None] = []
    a = b = 0  # chunk-0 and chunk-1 forwards so far
    while len(out) < warm and (a < n or b < n):  # down the V to the turn, then both chunks
        if b < n and (b <= a - trip or a >= n):
            out.append((f1, b))
            b += 1
        else:
            out.append((f0, a))
            a += 1
    while b < n and b < a - lead:  # chunk 1 catches up to `lead` behind chunk 0
        out.append((f1, b))
        b += 1
    while a < n or b < n:  # then one of each
        out.append((f0, a) if a < n else None)
        a += 1
        if b < n:
            out.append((f1, b))
            b += 1
    return out


def _two(n: int, lag: int) -> list[tuple[int, int]]:
    """Chunk 1's and chunk 0's backwards (1 or 0, micro-batch): `lag` of chunk 1's first, then one of each."""
    out = []
    a = b = 0  # chunk-0 and chunk-1 backwards so far
    while a < n or b < n:
        if b < n and (a >= n or b < a + lag):
            out.append((1, b))
            b += 1
        else:
            out.append((0, a))
            a += 1
    return out

