"""A memory-controlled V family on the `zbv` placement: one V-shaped block per micro-batch,
repeated at a fixed interval, with the gaps inside the block chosen to fit a memory limit.

The idea is that of Qi et al., "Pipeline Parallelism with Controllable Memory" (2024): how much
memory a device holds in the steady state is how long a chunk's activation lives (from its F to
its W) over the interval between two micro-batches' blocks. Here a block gives every forward and
backward of one micro-batch a nominal slot (six tasks per micro-batch per device, so the blocks
of consecutive micro-batches are 6 slots apart):

- the forwards go down chunk 0 `fd` slots apart, turn on device p-1 in the next slot, and go back
  up chunk 1 `fu` slots apart;
- the loss's backward starts `turn` slots after the last forward, the backwards go down chunk 1
  `bd` slots apart, turn on device p-1 `bturn` slots later, and go back up chunk 0 `bu` apart.

The warm-up is filled apart from the block: device d runs its first chunk-0 and chunk-1 forwards
one slot apart, at most as many as ZB-V's warm-up does before the device's first backward
(2p-1-d and d+1) and as its memory limit allows; without that the block alone leaves a device
idle while micro-batch 0 goes down and back up the V. Each device takes its forwards and
backwards in nominal order (ties: the task later in the micro-batch's chain first, then the older
micro-batch); the nominal slot grows along every edge, so no order can deadlock. The W passes are
placed as the orders are timed (tessel.baselines.wfill: into the bubbles, or when a forward needs
the memory they free), on the real costs and latencies; the walk may also run a ready forward
before a backward not yet ready where the limit allows it (`overtake`), and keep a W from
lengthening a wait before a chunk-1 forward (`urgent`) or a backward (`back`): each block is
timed with a few such walks (FILLS).

Longer gaps leave more slack for real costs and latency but keep activations longer; the family
tries a fixed grid of blocks and keeps those whose per-device peak fits the limit, counted on the
order with each W right after its B (known from the order alone: a device runs one task at a
time); the timing may keep W passes back but runs them before a forward that would go over the
limit, so that peak bounds the timed schedule's. It times every fitting block over a few
micro-batches (the warm-up, some periods, the cool-down: what tells blocks apart), the best KEEP
over all of them, and returns the shortest: linear in the tasks, times the grid's size.

The family also races blocks squeezed (tessel.baselines.squeeze, SQUEEZED: every task as early as
its inputs' slots and the limit allow, instead of the early runs):
the squeeze may also move a steady-state forward into a slot the block leaves to a W where the limit
has room, which the early runs never do. Under V-Min's memory with profiled costs (the order counts
each W right after its B, where V-Min's own count holds some W passes back: room for more
activations in flight) 4-8% shorter at p = 4-8 (p = 8, m = 32: 108.916 -> 103.316, V-Min 108.904;
with latency 115.176 -> 106.308, V-Min 114.768). At p = 16 that squeeze packs the warm-up with
forwards and the steady state starves (131.1 where the block's warm-up gives 124.7); squeezed with
the W passes in slots of their own (`slotted`) it is the shortest there: m = 32, profiled,
124.652 -> 124.204 (V-Min 124.508), with latency 132.076 -> 131.528 (131.896). Squeezed: the
blocks with fu = 1 (V-Min's block has fd = 1, V-Half's fd = 2), slotted only those with fd = fu = 1
(most slotted blocks stay distinct after the squeeze, where half of the others collapse into the
same orders: the cost is the squeeze, 25-45 ms a block at p = 16). They are screened over p +
SQUEEZE_FEW micro-batches with two walks, the one that runs the orders as given (SQUEEZE_SCREEN:
the slotted blocks that win at p = 16) and SCREEN (V-Half's block squeezed wins with it: held-out
p = 12, m = 36, V-Half's memory, latency: 109.808 -> 108.888, V-Half 109.304), and the best
SQUEEZE_KEEP distinct blocks are timed over every micro-batch with every walk of FILLS. The
screen's length moves which held-out rows are won: over the plain blocks' 2p + 4 micro-batches
V-Min's memory at p = 12, m = 36 gives 127.344 (V-Min 127.724, p + 8: 127.796) but V-Half's with
latency at p = 14, m = 42 128.388 (V-Half 128.116, p + 8: 127.612), a fifth slower; p + 8 is kept.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import order_peak, span
from .deadline import OutOfTime
from .shapes import BaselineError, Chain
from .squeeze import squeeze_orders
from .wfill import fill_weights
from .zbv_hand import zbv_hand_orders

INTERVAL = 6  # slots per micro-batch per device: F, B and W of two chunks
KEEP = 4  # blocks timed over every micro-batch, the best over a few
SQUEEZE_FEW = 8  # squeezed blocks are screened over p + this many micro-batches
SQUEEZE_KEEP = 3  # squeezed blocks timed so, the best over a few


@dataclass(frozen=True)
class Fill:
    """How the W-filling walk times a block's orders (tessel.baselines.wfill: `slack`, `wait`,
    `overtake`, `hold`); `urgent`: no W lengthens a wait before a chunk-1 forward, `back`: nor
    before a backward."""
    slack: float = 0.0
    wait: float = 0.0
    overtake: bool = False
    urgent: bool = False
    back: bool = False
    hold: bool = False
    reorder: bool = True  # a ready task may move up its device's order (wfill's LOOKAHEAD)


# Every block is screened with the `urgent` walk below (with latency, a forward's input often
# lands a little after a W would have to start: with W passes let into such waits, 0.4-1.4%
# shorter at p = 6, V-Half's memory; screened with the plain slack 0.5 instead, p = 6, m = 18,
# latency: 53.072 where this screen's blocks give 52.980). The best KEEP are timed with each of
# FILLS, measured on `zbv`, profiled costs, p = 6 and 8, m = 2p..4p, V-Half's and V-Min's memory
# (bench/vpeers.py); the other walks tried there never won alone:
# - `wait` 0.2 (a device about to start a ready forward waits up to a fifth of it for one nearer
#   the loss): with latency, V-Half's memory, p = 6, m = 12 / 18: 38.612 -> 38.176 / 53.804 ->
#   53.368 (micro-batch 0's trip back up the V is not held behind one more chunk-0 forward);
# - `overtake` (a ready forward before a backward not yet ready, where the limit allows): without
#   latency, V-Min's memory at p = 6 (43.940 -> 43.440 at m = 12) and V-Half's at p = 8 (90.464 ->
#   90.008 at m = 32);
# - slack 0.8, `urgent` (a W may lengthen a wait by most of its length, but never one before a
#   chunk-1 forward: that forward carries its micro-batch back to the loss, which every device's
#   backward waits on): with latency, V-Half's memory, p = 6 m = 24: 68.684 -> 67.860, p = 8
#   m = 32: 93.392 -> 91.788; slack 0.8 alone: with latency, V-Min's memory (43.404 -> 43.268).
# The first of FILLS is that walk with `back` too: no W lengthens a wait before a backward
# either. In the cool-down each device's backwards are the chain the last micro-batches'
# gradients run down and back up the V, and a W let into the wait before each (up to 0.8 of
# the W: 0.2 a device, profiled costs) adds up along it. With latency, V-Half's memory, p = 8,
# m = 16 / 24 / 32: 52.108 -> 51.600 / 71.948 -> 71.440 / 91.788 -> 91.280 (V-Half: 51.864,
# 71.704, 91.544), p = 6, m = 12 / 18 / 24: 38.192 -> 37.848 / 52.980 -> 52.728 / 67.860 ->
# 67.608. The first two walks `hold` with `wait` 0.5: a device whose next forward is due within
# half a forward does not run a later one first (at p = 16 micro-batch 0's chunk-1 forward
# reaches device 13 a latency after it could start one more chunk-0 forward, and that one holds
# the trip back up the V for its whole length): V-Half's memory, m = 32, latency: 107.712 ->
# 106.608 (V-Half: 107.272), without latency 104.140 -> 103.740 (104.144); V-Min's with latency
# 135.908 -> 133.992; p = 8, V-Half's, no latency, m = 32: 90.008 -> 89.948. Those two replaced
# (0.8, 0.2, urgent) and (0.5, 0.2): the shortest walk never longer on the grid above (p = 6,
# 8, 16, unit costs too; bench/vpeers.py's rows).
# The last two walks run the orders as given (no ready task moved up: `reorder` off). On V-Min's
# own F/B orders the plain such walk is V-Min to the digit (p = 16, m = 32: 124.508, 131.896 with
# latency) where every reordering walk is 0.1-2.3% longer; on v-mem's blocks under V-Min's memory
# with latency, p = 16: 133.992 -> 132.076 (m = 32), 185.968 -> 182.920 (48), 238.008 -> 233.772 (64).
SCREEN = Fill(0.8, 0.2, urgent=True)
SQUEEZE_SCREEN = Fill(0.0, reorder=False)
FILLS = (Fill(0.8, 0.5, urgent=True, back=True, hold=True), Fill(0.5, 0.5, hold=True), Fill(0.5, overtake=True),
         Fill(0.8, 0.2), Fill(0.0), Fill(0.0, reorder=False), Fill(0.5, 0.5, hold=True, reorder=False))


@dataclass(frozen=True)
class Gaps:
    """Nominal slots between consecutive tasks of one micro-batch's block (see the module doc)."""
    fd: int
    fu: int
    turn: int
    bd: int
    bu: int
    bturn: int
    lean: int = 0  # chunk-1 forwards fewer than ZB-V's in the warm-up (room for chunk 0's)
    squeeze: bool = False  # the block squeezed (tessel.baselines.squeeze) instead of given early runs
    slotted: bool = False  # squeezed with the W passes in slots of their own


GRID = tuple(Gaps(fd, fu, turn, bd, bu, bturn) for fd, fu, bd, bu in itertools.product((1, 2), repeat=4)
             for turn in (1, 2, 3, 4) for bturn in (1, 2))
SQUEEZED = (tuple(replace(g, squeeze=True) for g in GRID if g.fu == 1)
            + tuple(replace(g, squeeze=True, slotted=True) for g in GRID if g.fd == g.fu == 1))


@dataclass(frozen=True)
class _Block:
    """Micro-batch 0's nominal slots, the chain's rank of each block (ties), and per forward
    block how many of its micro-batches run early, one slot apart (the warm-up)."""
    slot: dict[str, int]
    rank: dict[str, int]
    early: dict[str, int]


def block_slots(c: Chain, g: Gaps) -> dict[str, int]:
    """Each forward's and backward's nominal slot in micro-batch 0's block."""
    half = len(c.forward) // 2
    slot: dict[str, int] = {}
    t = 0
    for s, f in enumerate(c.forward):
        if s:
            t += g.fd if s < half else (1 if s == half else g.fu)
        slot[f] = t
    t += g.turn
    for k, b in enumerate(c.backward):  # c.backward[k] is stage 2p-1-k's backward
        if k:
            t += g.bd if k < half else (g.bturn if k == half else g.bu)
        slot[b] = t
    return slot


def _device_order(p: Placement, c: Chain, blk: _Block, n: int, d: int) -> list[Key]:
    """Device d's forwards and backwards in nominal order, each backward followed by its W (the
    least memory the order can hold; the timing takes the W passes out and places them itself)."""
    def key(t: Key) -> tuple[int, int, int]:
        b, m = t
        step = 1 if m < blk.early.get(b, 0) else INTERVAL
        return (blk.slot[b] + step * m, -blk.rank[b], m)
    order = sorted(((b.id, m) for b in p.blocks_on(d) if b.id in blk.slot for m in range(n)), key=key)
    return [x for b, m in order for x in ([(b, m), (c.weight[b], m)] if b in c.weight else [(b, m)])]


def _monotone(k0: list[int], k1: list[int]) -> None:
    """Early runs that keep every edge forward in the nominal order: a forward runs early only
    if its input does (chunk 0's early runs shrink down the V, chunk 1's shrink back up it)."""
    last = len(k0) - 1
    for d in range(1, last + 1):
        k0[d] = min(k0[d], k0[d - 1])
    k1[last] = min(k1[last], k0[last])
    for d in range(last - 1, -1, -1):
        k1[d] = min(k1[d], k1[d + 1])


def _shorten(k0: list[int], k1: list[int], d: int) -> None:
    """One early forward fewer on device d, from the longer of its two warm-up runs."""
    if k0[d] > k1[d]:
        k0[d] -= 1
    elif k1[d]:
        k1[d] -= 1


@dataclass(frozen=True)
class _Warm:
    """Per device: its two forward blocks, the memory of one activation, the early runs."""
    first: list[str]
    second: list[str]
    unit: list[Number]
    k0: list[int]
    k1: list[int]

    def set(self, blk: _Block, d: int) -> None:
        blk.early.update({self.first[d]: self.k0[d], self.second[d]: self.k1[d]})


def _trim(p: Placement, c: Chain, blk: _Block, w: _Warm, n: int, d: int, cap: Number) -> None:
    """Cut device d's early runs until its order over `n` micro-batches fits `cap`."""
    while True:
        w.set(blk, d)
        over = order_peak(p, _device_order(p, c, blk, n, d)) - cap
        if w.k0[d] + w.k1[d] == 0 or over <= EPS:
            return
        for _ in range(max(1, math.floor(over / w.unit[d] + EPS))):  # fewer early activations
            _shorten(w.k0, w.k1, d)


def vmem_orders(p: Placement, c: Chain, n: int, g: Gaps,
                limit: Sequence[Number] | None = None) -> list[list[Key]] | None:
    """Each device's order under the block `g` (each W right after its B); with `limit`, the
    warm-ups cut to fit it, None when the block's steady state alone does not (the orders of
    all `n` micro-batches may still be over: the caller checks them)."""
    size, k = len(c.forward), p.devices
    rank = {b: i for i, b in enumerate(list(c.forward) + list(c.backward))}
    blk = _Block(block_slots(c, g), rank, {})
    few = min(n, 2 * size)  # the warm-up and a few periods show the peak; the caller checks the whole
    if limit is not None and any(order_peak(p, _device_order(p, c, blk, few, d)) > limit[d] + EPS for d in range(k)):
        return None  # the steady state alone is over: no warm-up can help, squeezed or not
    if g.squeeze:
        return squeeze_orders(p, c, n, blk.slot, rank, INTERVAL, limit, g.slotted)
    first, second = list(c.forward[:k]), [c.forward[size - 1 - d] for d in range(k)]
    w = _Warm(first, second, [max(p.by_id[a].memory, p.by_id[b].memory, EPS) for a, b in zip(first, second)],
              [min(n, 2 * k - 1 - d) for d in range(k)], [min(n, d + 1 - g.lean) for d in range(k)])
    _monotone(w.k0, w.k1)
    if limit is not None:
        for d in range(k):
            # every early forward is held before the device's first backward: never more than fit
            while w.k0[d] + w.k1[d] > math.floor(limit[d] / w.unit[d] + EPS) and w.k0[d] + w.k1[d]:
                _shorten(w.k0, w.k1, d)
            _trim(p, c, blk, w, few, d, limit[d])
        _monotone(w.k0, w.k1)
    for d in range(k):
        w.set(blk, d)
    return [_device_order(p, c, blk, n, d) for d in range(k)]


def _fitting(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None,
             grid: Sequence[Gaps]) -> list[tuple[Gaps, list[list[Key]]]]:
    """The blocks whose orders over `n` micro-batches fit the limit, each distinct order once."""
    seen: set[tuple[tuple[Key, ...], ...]] = set()
    out: list[tuple[Gaps, list[list[Key]]]] = []
    for g in grid:
        orders = vmem_orders(p, c, n, g, limit)
        if orders is None:
            continue
        frozen = tuple(tuple(o) for o in orders)
        if frozen in seen:
            continue
        seen.add(frozen)
        if limit is None or all(order_peak(p, o) <= cap + EPS for o, cap in zip(orders, limit)):
            out.append((g, orders))
    return out


def _shortest(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None,
              fits: list[tuple[Gaps, list[list[Key]]]],
              fills: Sequence[Fill] = (Fill(),), best: Number = math.inf) -> list[tuple[Number, Gaps, dict[Key, Number]]]:
    """The fitting blocks timed (with each of `fills`), shortest first; a timing cut off once it
    cannot beat the best so far (`best` to begin with). Past a deadline set around the build
    (tessel.baselines.deadline), those timed by then (OutOfTime when none is)."""
    late = set(c.weight.values())
    chunk1, back = tuple(c.forward[len(c.forward) // 2:]), tuple(c.backward)
    out: list[tuple[Number, Gaps, dict[Key, Number]]] = []
    for (g, orders), f in itertools.product(fits, fills):
        try:
            starts = fill_weights(p, [[x for x in o if x[0] not in late] for o in orders], c.weight, limit, best,
                                  slack=f.slack, wait=f.wait, overtake=f.overtake,
                                  urgent=(chunk1 if f.urgent else ()) + (back if f.back else ()),
                                  hold=f.hold, reorder=f.reorder)
        except OutOfTime:
            if not out:
                raise
            break  # anytime: the blocks timed by the deadline set around the build
        if starts is not None:
            length = span(p, starts)
            best = min(best, length)
            out.append((length, g, starts))
    return sorted(out, key=lambda t: t[0])


def vmem_starts(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None) -> dict[Key, Number]:
    """The shortest schedule of the grid whose peaks fit `limit` (per device); BaselineError when
    none does. Every block is timed over a few micro-batches (the warm-up, some periods and the
    cool-down: what tells blocks apart), the best KEEP of them over all `n`, with and without a
    leaner warm-up, each with every walk of FILLS; then the squeezed blocks alike (_squeezed).
    Anytime where those few are all `n` (p = 16, m = 32: 1-8 CPU s a build): past a deadline set
    around the build, the shortest timed by then."""
    few = min(n, 2 * p.devices + 4)
    tried = _shortest(p, c, few, limit, _fitting(p, c, few, limit, GRID), (SCREEN,))
    # the best blocks over every micro-batch, each with the leaner warm-up too (it moves only the
    # warm-up, which the few micro-batches do not weigh against the steady state)
    keep = [replace(g, lean=lean) for _, g, _ in tried[:KEEP] for lean in (0, 1)]
    try:
        final = _shortest(p, c, n, limit, _fitting(p, c, n, limit, keep), FILLS)
    except OutOfTime:
        final = []
        if few < n:
            raise
    if few == n:  # the first timings were of every micro-batch: at a deadline, the best of both
        final = sorted(final + tried, key=lambda t: t[0])
    final = sorted(final + _squeezed(p, c, n, few, limit, final[0][0] if final else math.inf), key=lambda t: t[0])
    if not final:
        raise BaselineError("no block of the family fits the memory limit")
    return final[0][2]


def _squeezed(p: Placement, c: Chain, n: int, few: int, limit: Sequence[Number] | None,
              best: Number) -> list[tuple[Number, Gaps, dict[Key, Number]]]:
    """The squeezed blocks screened over `few` micro-batches, the best SQUEEZE_KEEP timed over all
    `n` with every walk of FILLS, each walk cut off once it cannot beat `best` (the plain blocks'
    shortest). After the plain blocks, so a deadline leaves those: past it, the squeezed blocks
    timed by then (none before the screen ends)."""
    few = min(few, p.devices + SQUEEZE_FEW)
    try:
        screened = _shortest(p, c, few, limit, _fitting(p, c, few, limit, SQUEEZED), (SQUEEZE_SCREEN, SCREEN))
    except OutOfTime:
        return []
    done = screened if few == n else []
    try:
        keep = list(dict.fromkeys(g for _, g, _ in screened))[:SQUEEZE_KEEP]
        return done + _shortest(p, c, n, limit, _fitting(p, c, n, limit, keep), FILLS, best)
    except OutOfTime:
        return done


def vmem_futile(p: Placement, c: Chain, n: int, limit: Sequence[Number] | None) -> str | None:
    """Why racing v-mem is pointless under `limit`, or None: where ZB-V's hand-made orders fit
    (1F1B's 2p chunk activations or more), the family keeps ZB-V's warm-up whole and its blocks
    only hold activations longer; measured at p = 4, 6, 8, m = 2p..4p, unit and profiled costs,
    latency or not, limits 2p and 2p + 1: never shorter than the best of zb-v-hand, zb-v and
    dualpipev (bench/results/peers-v*.md), and 0.2-2 s a build. With no limit at all it may be
    shorter, at twice the memory (p = 4, m = 8, latency: 21.652 holding 16 activations where
    zb-v-hand takes 21.792 holding 8): skipped there too. The check: the orders' peaks."""
    hand = zbv_hand_orders(p, c, n)
    if limit is None or all(order_peak(p, o) <= cap + EPS for o, cap in zip(hand, limit)):
        return "zb-v-hand fits this limit, where v-mem was never shorter"
    return None
