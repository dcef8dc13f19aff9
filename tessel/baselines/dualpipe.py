"""DualPipeV (DeepSeek-V3, 2024; the V-shaped half of DualPipe) on the `zbv` placement.

Device r holds two chunks of a V: stage r (chunk 0) and stage 2p-1-r (chunk 1). Each device runs
eight phases; F0/F1 are its chunks' forwards, B0/B1 their backwards (B then W back to back: a
"full" backward), I an input gradient alone whose W waits in a queue:

1. 2(p-r-1) x F0                       warm-up of chunk 0
2. r+1 x (F0 F1)                       both chunks fill
3. p-r-1 x (I1, a queued W, F1)        zero-bubble steps on chunk 1
4. n-2p+r+1 x ((F0 B1) (F1 B0))        the main phase: each overlapped F&B pair back to back
                                       (on the last device the very first pair is not overlapped;
                                       as a run of tasks on one device that is the same order)
5. p-r-1 x (B1, (F1 B0))               chunk 0's forwards are done
6. r+1 x (B1 B0)                       from the middle pair on (the first half on even devices,
                                       just after B1 on odd ones) as I only, W queued
7. p-r-1 x (a queued W, B0)            B0 as I once phase 6 switched to I
8. r+1 x a queued W                    the cool-down's weight passes

Peak memory: phases 1-2 leave 2p chunk activations on every device and phase 3 holds it there
(each I's W runs before the next F); each pair of phase 4 starts its F before its B frees, so the
peak is 2p + 1 chunk activations on every device (1F1B's 2p, plus one). The orders are per-device;
tessel.timing places them in time, so latencies and real costs are honoured as they are.
"""
from __future__ import annotations

from collections import deque

from ..key import Key
from ..placement import Placement
from .shapes import BaselineError, Chain


def dualpipev_orders(p: Placement, c: Chain, n: int) -> list[list[Key]]:
    """Each device's DualPipeV order of the V chain `c` (stage k on device k or 2p-1-k)."""
    k = p.devices
    if n < 2 * k:
        raise BaselineError(f"dualpipev needs at least as many micro-batches as the V's {2 * k} stages, got {n}")
    orders: list[list[Key]] = [[] for _ in range(k)]
    for r in range(k):
        orders[c.device(p, c.forward[r])] = _device_order(c, r, k, n)
    return orders


class _Device:
    """One device's order under construction: the next micro-batch of each stage's F and B."""

    def __init__(self, c: Chain, stages: tuple[int, int]) -> None:
        size = len(c.forward)
        self.fwd = {s: c.forward[s] for s in stages}
        self.bwd = {s: c.backward[size - 1 - s] for s in stages}
        self.wgt = {s: c.weight[self.bwd[s]] for s in stages}
        self.nf = dict.fromkeys(stages, 0)
        self.nb = dict.fromkeys(stages, 0)
        self.queue: deque[Key] = deque()
        self.order: list[Key] = []

    def f(self, s: int) -> None:
        self.order.append((self.fwd[s], self.nf[s]))
        self.nf[s] += 1

    def b(self, s: int, split: bool = False) -> None:
        """A backward: B and its W back to back, or (split) B now and its W queued."""
        m = self.nb[s]
        self.nb[s] += 1
        self.order.append((self.bwd[s], m))
        if split:
            self.queue.append((self.wgt[s], m))
        else:
            self.order.append((self.wgt[s], m))

    def w(self) -> None:
        if self.queue:
            self.order.append(self.queue.popleft())


def _device_order(c: Chain, r: int, k: int, n: int) -> list[Key]:
    s0, s1 = r, 2 * k - 1 - r
    d = _Device(c, (s0, s1))
    for _ in range(2 * (k - r - 1)):
        d.f(s0)
    for _ in range(r + 1):
        d.f(s0)
        d.f(s1)
    for _ in range(k - r - 1):
        d.b(s1, split=True)
        d.w()
        d.f(s1)
    for _ in range(n - 2 * k + r + 1):
        d.f(s0)
        d.b(s1)
        d.f(s1)
        d.b(s0)
    for _ in range(k - r - 1):
        d.b(s1)
        d.f(s1)
        d.b(s0)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        d.b(s1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        d.b(s0, split)
    for _ in range(k - r - 1):
        d.w()
        d.b(s0, split)
    while d.queue:  # phase 8 (r + 1 of them; any the phases above left are drained too)
        d.w()
    return d.order
