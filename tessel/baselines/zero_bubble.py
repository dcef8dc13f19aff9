"""Zero-bubble schedules (Qi et al., ICLR 2024 and NeurIPS 2024) built by one timed walk.

ZB-H2, ZB-V and ZB-V's memory variants share one idea: with the backward split into B (input
gradient, on the critical path) and W (weight gradient, free to move), a device never waits as
long as it has a W to run, and a memory budget decides how far ahead forwards may run. The walk
places tasks device by device in time order; at its current time a device runs, in this order:

1. a ready B (the oldest micro-batch, then the block nearest the loss);
2. a ready forward that the memory budget admits (nearest the loss first, then the oldest);
3. a pending W when memory blocks a ready forward, or when the W ends before any B or forward
   can arrive (it fills a bubble without delaying the critical path);
4. else it waits for the next event.

Warm-up forwards therefore fill the pipeline up to the budget (ZB-H2's extra forwards), W passes
drift to the tail where they fill the cool-down (the parallelogram), and latencies are part of
every arrival time. Memory is the placement's own accounting (allocation at a forward's start,
release at the end of B and W); a forward is admitted only when the device keeps room for the
later forwards of its micro-batch on that device, so the oldest micro-batch always progresses
and the walk cannot deadlock (W passes are forced when memory is short).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..bounds import paths
from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import DeadlockError, input_ready
from .shapes import BaselineError, Chain

Starts = dict[Key, Number]


@dataclass(frozen=True)
class Plan:
    """The chain to walk and the memory cap of each device."""
    chain: Chain
    caps: Sequence[Number]


class _Walk:
    def __init__(self, p: Placement, n: int, plan: Plan) -> None:
        self.p, self.n, self.caps = p, n, plan.caps
        c = plan.chain
        order = list(c.forward) + list(c.backward)
        self.rank = {b: i for i, b in enumerate(order)}
        self.dev = {b.id: b.devices[0] for b in p.blocks}
        self.runs: list[list[str]] = [[] for _ in range(p.devices)]  # F and B blocks per device
        for b in order:
            self.runs[self.dev[b]].append(b)
        self.weight = c.weight
        self.headroom = self._headroom(c, False)
        self.warm_headroom = self._headroom(c, True)
        first = {self.dev[f]: f for f in reversed(c.forward)}
        self.warm_until = {d: next((g for g in c.forward if self.dev[g] == d and g != f), None) for d, f in first.items()}
        self.warm = [True] * p.devices  # the device's second chunk has not started yet
        self.depth = self._depth(c)
        self.next = {b: 0 for b in order}
        self.cur: list[Number] = [0] * p.devices
        self.mem: list[Number] = [0] * p.devices
        self.frees: list[list[tuple[Number, Number]]] = [[] for _ in range(p.devices)]  # (end, amount)
        self.pending: list[deque[Key]] = [deque() for _ in range(p.devices)]
        self.left = [n * len(p.blocks_on(d)) for d in range(p.devices)]
        self.start: Starts = {}
        self.end: dict[Key, Number] = {}
        self.parked: set[int] = set()  # devices waiting at their current time for another one's move

    def _headroom(self, c: Chain, warm: bool) -> dict[str, Number]:
        """Memory a forward leaves free: room for the later forwards of its micro-batch on its
        device, which keeps the oldest micro-batch moving (no deadlock). Until the first of those
        later forwards has run on the device (the warm-up), room for as many as can arrive before
        it: one `j - k` hops on comes back behind the `len - (j - k)` micro-batches the rest of the
        chain can hold (device i of a V keeps 2i + 1 chunks free, as ZB-V's warm-up does)."""
        out: dict[str, Number] = {}
        size = len(c.forward)
        for k, f in enumerate(c.forward):
            later = [(j, g) for j, g in enumerate(c.forward) if j > k and self.dev[g] == self.dev[f]]
            out[f] = sum(max(self.p.by_id[g].memory, 0) * (max(1, size - (j - k)) if warm else 1) for j, g in later)
        return out

    def _depth(self, c: Chain) -> dict[str, tuple[str, int]]:
        """Per forward: the next block of its micro-batch on its device (a later chunk's forward, or
        its backward), and how many micro-batches the forward may run ahead of it: enough to fill
        the wait for that block in the warm-up, and no more (ZB-H2's and ZB-V's warm-up depth)."""
        est = paths(self.p).earliest
        chain = list(c.forward) + list(c.backward)
        out = {}
        for i, f in enumerate(c.forward):
            lead = next(b for b in chain[i + 1:] if self.dev[b] == self.dev[f])
            dur = self.p.by_id[f].duration
            gap = est[lead] - est[f] - dur
            out[f] = (lead, 1 + max(0, math.ceil(gap / dur - EPS)))
        return out

    # ---- timing ---------------------------------------------------------------------------
    def _ready(self, b: str, m: int) -> tuple[Number, bool]:
        return input_ready(self.p, b, m, self.end, self.dev, self.cur)

    def _fits(self, d: int, f: str) -> bool:
        lead, depth = self.depth[f]
        if self.next[f] - self.next[lead] >= depth:
            return False
        own = max(self.p.by_id[f].memory, 0)
        room = self.headroom[f]
        if self.warm[d]:  # never so much that the first micro-batch stays out
            room = max(room, min(self.warm_headroom[f], self.caps[d] - own))
        return self.mem[d] + own + room <= self.caps[d] + EPS

    def _release(self, d: int, t: Number) -> Number:
        """Apply the releases ended by `t` (to rounding); the time at which they all have ended."""
        keep = []
        for end, amount in self.frees[d]:
            if end <= t + EPS:
                self.mem[d] -= amount
                t = max(t, end)  # a release a rounding error late still comes first (rule 4)
            else:
                keep.append((end, amount))
        self.frees[d] = keep
        return t

    def _put(self, d: int, b: str, m: int, t: Number) -> None:
        blk = self.p.by_id[b]
        # the start as the schedule will store it (near-integers snap); an allocation never snaps
        # below the releases it was admitted after
        snap = round(t) if abs(t - round(t)) < EPS else t
        t = t + 2 * EPS if blk.memory > 0 and snap < t else snap
        self.start[(b, m)] = t
        self.end[(b, m)] = t + blk.duration
        self.cur[d] = t + blk.duration
        self.left[d] -= 1
        self.parked.clear()
        if blk.memory > 0:
            self.mem[d] += blk.memory
        elif blk.memory < 0:
            self.frees[d].append((t + blk.duration, -blk.memory))
        if b in self.next:
            self.next[b] += 1
        if b == self.warm_until.get(d):
            self.warm[d] = False
        if b in self.weight:
            self.pending[d].append((self.weight[b], m))

    # ---- the decision of one device ---------------------------------------------------------
    def _step(self, d: int) -> None:
        t = self.cur[d] = self._release(d, self.cur[d])
        cands = []  # (ready time, known, is_forward, block, micro-batch)
        for b in self.runs[d]:
            m = self.next[b]
            if m < self.n:
                r, known = self._ready(b, m)
                cands.append((r, known, self.p.by_id[b].kind != "backward", b, m))
        ready = [c for c in cands if c[1] and c[0] <= t + EPS]
        bwd = sorted((m, -self.rank[b], b) for r, k, fw, b, m in ready if not fw)
        if bwd:
            return self._put(d, bwd[0][2], bwd[0][0], t)
        fwd = sorted((-self.rank[b], m, b) for r, k, fw, b, m in ready if fw and self._fits(d, b))
        if fwd:
            return self._put(d, fwd[0][2], fwd[0][1], t)
        blocked = any(fw for r, k, fw, b, m in ready)  # a ready forward memory keeps out
        coming = [r for r, k, fw, b, m in cands if not fw or self._fits(d, b)]
        if self.pending[d]:
            w, m = self.pending[d][0]
            if blocked or min(coming, default=t + self.p.by_id[w].duration) >= t + self.p.by_id[w].duration - EPS:
                self.pending[d].popleft()
                return self._put(d, w, m, t)
        self._wait(d, t, [r for r, k, fw, b, m in cands if k and r > t + EPS])

    def _wait(self, d: int, t: Number, known: list[Number]) -> None:
        others = [self.cur[e] for e in range(self.p.devices) if e != d and self.left[e] and self.cur[e] > t + EPS]
        nxt = min(known + others, default=None)
        if nxt is not None:
            self.cur[d] = nxt
            return
        if any(self.left[e] and e not in self.parked and e != d for e in range(self.p.devices)):
            self.parked.add(d)  # another device at this same time has yet to decide
            return
        if self.pending[d]:  # nothing else can move: a W never hurts then
            w, m = self.pending[d].popleft()
            return self._put(d, w, m, t)
        raise DeadlockError(f"zero-bubble walk stuck on device {d} at time {t:g}")

    def run(self) -> Starts:
        while any(self.left):
            live = [e for e in range(self.p.devices) if self.left[e]]
            d = min((e for e in live if e not in self.parked), key=lambda e: (self.cur[e], e), default=None)
            if d is None:  # everyone waits on everyone at one time: the first with a W runs it
                d = min(live, key=lambda e: (not self.pending[e], self.cur[e], e))
                self.parked.discard(d)
            self._step(d)
        return self.start


def zero_bubble_starts(p: Placement, n: int, plan: Plan) -> Starts:
    """Start times of the zero-bubble walk; BaselineError when a cap is below one micro-batch's need."""
    for d, cap in enumerate(plan.caps):
        need = sum(max(b.memory, 0) for b in p.blocks_on(d))
        if need > cap + EPS:
            raise BaselineError(f"device {d} needs memory {need:g} for one micro-batch, over its limit {cap:g}")
    return _Walk(p, n, plan).run()
