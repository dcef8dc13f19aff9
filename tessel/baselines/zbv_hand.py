"""ZB-V's hand-made schedule (Qi et al., "Pipeline parallelism with controllable memory", 2024) on
the `zbv` placement: the published V schedule that torch.distributed.pipelining's
ScheduleZBVZeroBubble also runs, written from its phases.

Device r holds stage r (chunk 0) and stage 2p-1-r (chunk 1); F0/F1 its chunks' forwards, B0/B1
their input gradients, W0/W1 their weight gradients. N = max(n, 2p - 1) micro-batches are laid
out and the tasks of micro-batches >= n left out afterwards (the warm-up's shape needs 2p - 1):

1. 2(p - r) - 1 x F0                    chunk 0 fills the V down to the turn
2. r x (F1 F0)                          both chunks
3. p - r x (F1 B1 W1)                   chunk 1's first backwards, each W at once
4. until every forward ran: (F0 while any is left) B0 W0 F1 B1 W1     the steady state
5. r x (B0 B1)                          the cool-down keeps its W passes back ...
6. p - r x (B0, the oldest W0)
7. the W1 left, then the W0 left        ... and runs them at the end

Peak memory: phases 1-2 put 2(p - r) - 1 + 2r = 2p - 1 chunk activations on device r, phase 3
adds and frees one at a time (F1 then its W1): 2p, 1F1B's M_B, on every device once n >= 2p - 1.

Timed two ways, the shorter kept: the orders as written, and with the cool-down's W passes (those
after the device's last forward) filled into its bubbles (tessel.baselines.wfill, nothing
reordered): with real costs and latency a cool-down B often waits for its input, and a W run
there ends the device sooner (what ZB-V's own generator does; 0.004-0.036 shorter on the
profiled costs with latency at p = 6-8). No forward follows those W passes: the peak stays.
Up to FILL_WORK (devices x tasks) only: the filling walk is quadratic in the devices.
"""
from __future__ import annotations

from ..key import Key
from ..placement import Number, Placement
from ..timing import earliest_starts, span
from .shapes import Chain
from .wfill import fill_weights

# the W filling's walk picks the device furthest behind among all at each step: devices x tasks.
# Beyond this much the orders as written are the answer, so the linear baseline the race runs
# first at any size stays cheap (p = 16, N = 128: 0.27 s against 0.15 s; p = 64: 2.7 s against 0.9)
FILL_WORK = 500_000


def zbv_hand_starts(p: Placement, c: Chain, n: int) -> dict[Key, Number]:
    """Start times of the hand-made orders: the shorter of the two timings (module doc)."""
    orders = zbv_hand_orders(p, c, n)
    plain = earliest_starts(p, n, orders)
    if p.devices * n * len(p.blocks) > FILL_WORK:
        return plain
    filled = fill_weights(p, [_cool_down_free(c, o) for o in orders], c.weight, None, reorder=False)
    return plain if filled is None or span(p, plain) <= span(p, filled) else filled


def _cool_down_free(c: Chain, order: list[Key]) -> list[Key]:
    """`order` without the W passes after its last forward (the walk fills them in)."""
    forward, late = set(c.forward), set(c.weight.values())
    last = max(i for i, (b, _) in enumerate(order) if b in forward)
    return [x for i, x in enumerate(order) if i <= last or x[0] not in late]


def zbv_hand_orders(p: Placement, c: Chain, n: int) -> list[list[Key]]:
    """Each device's order of ZB-V's hand-made schedule for the V chain `c`."""
    k = p.devices
    orders: list[list[Key]] = [[] for _ in range(k)]
    for r in range(k):
        orders[c.device(p, c.forward[r])] = [(b, m) for b, m in _device(c, r, k, max(n, 2 * k - 1)) if m < n]
    return orders


def _device(c: Chain, r: int, k: int, total: int) -> list[Key]:
    size = len(c.forward)
    f0, f1 = c.forward[r], c.forward[size - 1 - r]
    b0, b1 = c.backward[size - 1 - r], c.backward[r]  # stage s's backward is c.backward[size - 1 - s]
    w0, w1 = c.weight[b0], c.weight[b1]
    nf0 = nf1 = nb0 = nb1 = 0
    out: list[Key] = []
    for _ in range(2 * (k - r) - 1):
        out.append((f0, nf0))
        nf0 += 1
    for _ in range(r):
        out += [(f1, nf1), (f0, nf0)]
        nf1, nf0 = nf1 + 1, nf0 + 1
    for _ in range(k - r):
        out += [(f1, nf1), (b1, nb1), (w1, nb1)]
        nf1, nb1 = nf1 + 1, nb1 + 1
    while nf1 < nf0 or nf0 < total:
        if nf0 < total:
            out.append((f0, nf0))
            nf0 += 1
        out += [(b0, nb0), (w0, nb0), (f1, nf1), (b1, nb1), (w1, nb1)]
        nb0, nf1, nb1 = nb0 + 1, nf1 + 1, nb1 + 1
    nw0, nw1 = nb0, nb1
    for _ in range(r):
        out += [(b0, nb0), (b1, nb1)]
        nb0, nb1 = nb0 + 1, nb1 + 1
    for _ in range(k - r):
        out += [(b0, nb0), (w0, nw0)]
        nb0, nw0 = nb0 + 1, nw0 + 1
    out += [(w1, m) for m in range(nw1, nb1)] + [(w0, m) for m in range(nw0, nb0)]
    return out
