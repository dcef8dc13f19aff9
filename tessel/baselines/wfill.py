"""Time fixed per-device F and B orders with the W passes placed as they go (ZB's W filling).

A W depends only on its own B and nothing waits for it, so with the forward and backward orders
fixed, where the W passes go is a device-local choice: a device runs the next task of its order
when that task is ready; while it is not, it runs the oldest pending W if the W ends before the
task can be ready (it fills a bubble and delays nothing); and before a forward that would take the
device over its memory limit it runs pending W passes until the forward fits. The orders' own
peak with every W right after its B is then the most the walk can hold, so a limit that holds for
that holds here too. Devices decide in time order (the one furthest behind first), so a task's
inputs are known or bounded below when it is looked at; every edge of the orders goes forward in
one global order, so no device waits for ever.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Collection, Sequence

from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import DeadlockError, input_ready
from . import deadline

LOOKAHEAD = 4  # places on in its device's order a ready task may come from
CHECK_EVERY = 512  # steps between looks at the deadline (p = 16, N = 32: about 3,000 steps a walk)


class _Walk:
    def __init__(self, p: Placement, orders: Sequence[Sequence[Key]], weight: dict[str, str],
                 limit: Sequence[Number] | None, cutoff: Number, reorder: bool, slack: float = 0.0,
                 wait: float = 0.0, overtake: bool = False, urgent: Collection[str] = (), hold: bool = False) -> None:
        self.p, self.weight, self.cutoff, self.reorder, self.slack = p, weight, cutoff, reorder, slack
        self.wait, self.overtake, self.urgent, self.hold = wait, overtake, frozenset(urgent), hold
        self.orders = [list(o) for o in orders]  # a ready task may move up its device's order
        # W passes the orders list stay where they are; only the others are filled in
        late = set(weight.values())
        self.listed = {k for o in orders for k in o if k[0] in late}
        self.cap = list(limit) if limit is not None else [float("inf")] * p.devices
        self.dev = {b.id: b.devices[0] for b in p.blocks}
        self.rank = {b: i for i, b in enumerate(p.topo_order)}
        self.pos = [0] * p.devices
        self.cur: list[Number] = [0] * p.devices
        self.mem: list[Number] = [0] * p.devices
        self.pending: list[deque[Key]] = [deque() for _ in range(p.devices)]
        self.start: dict[Key, Number] = {}
        self.end: dict[Key, Number] = {}
        self.parked: set[int] = set()
        # each device's work not yet placed: its end is at least its time plus this
        self.work = [sum(p.by_id[b].duration + (p.by_id[weight[b]].duration if self._spawns(b, m) else 0)
                         for b, m in o) for o in orders]

    def _spawns(self, b: str, m: int) -> bool:
        """Whether (b, m) is a B whose W is left to the walk."""
        return b in self.weight and (self.weight[b], m) not in self.listed

    def _put(self, d: int, key: Key, t: Number) -> None:
        b, m = key
        blk = self.p.by_id[b]
        # the start as the schedule will store it (near-integers snap); an allocation never
        # snaps below the release it follows, or the schedule would count both at once
        snap = round(t) if abs(t - round(t)) < EPS else t
        t = t + 2 * EPS if blk.memory > 0 and snap < t else snap
        self.start[key], self.end[key] = t, t + blk.duration
        self.cur[d] = t + blk.duration
        self.work[d] -= blk.duration
        self.mem[d] += blk.memory
        self.parked.clear()
        if self._spawns(b, m):
            self.pending[d].append((self.weight[b], m))

    def _ready(self, b: str, m: int) -> tuple[Number, bool]:
        return input_ready(self.p, b, m, self.end, self.dev, self.cur)

    def _is_ready(self, b: str, m: int, t: Number) -> bool:
        return all((a, m) in self.end and self.end[(a, m)] + self.p.edge_latency(a, b) <= t + EPS
                   for a in self.p.preds[b])

    def _nearer_loss(self, d: int, t: Number) -> int | None:
        """With the next task a ready forward: the place of a ready forward further down the chain
        among the forwards right after it (the peak stays, as in _ready_later); the one nearer the
        loss goes first, as in ZB's walk: its backward comes back sooner."""
        order, by = self.orders[d], self.p.by_id
        here = self.rank[order[self.pos[d]][0]]
        for i in range(self.pos[d] + 1, min(len(order), self.pos[d] + 1 + LOOKAHEAD)):
            b, m = order[i]
            if by[b].memory <= 0:
                return None
            if self.rank[b] > here and self._is_ready(b, m, t):
                return i
        return None

    def _nearer_soon(self, d: int, t: Number) -> Number | None:
        """With the next task a ready forward: when a forward nearer the loss among the forwards
        right after it (as in _nearer_loss) is ready within `wait` of the next one's length, the
        time it is: the device waits for it rather than start the farther one (with latency, a
        V's chunk-1 forward arrives a latency after the device could start one more chunk-0
        forward, and that forward would hold micro-batch 0's trip back up the V for its whole
        length)."""
        order, by = self.orders[d], self.p.by_id
        b, _ = order[self.pos[d]]
        here, horizon = self.rank[b], t + self.wait * by[b].duration
        for i in range(self.pos[d] + 1, min(len(order), self.pos[d] + 1 + LOOKAHEAD)):
            b2, m2 = order[i]
            if by[b2].memory <= 0:
                return None
            r, known = self._ready(b2, m2)
            if self.rank[b2] > here and known and t + EPS < r <= horizon + EPS:
                return r
        return None

    def _ready_later(self, d: int, t: Number) -> int | None:
        """The place of a task a few places on in d's order that is ready at `t` and may run now
        rather than the device wait: a backward (it holds no memory), or a forward that only
        overtakes forwards (the device's level after them all is the same, and on the way it
        only rises: the order's peak stays). A ready task waits on nothing: no deadlock."""
        order, by = self.orders[d], self.p.by_id
        only_forwards = by[order[self.pos[d]][0]].memory > 0
        for i in range(self.pos[d] + 1, min(len(order), self.pos[d] + 1 + LOOKAHEAD)):
            b, m = order[i]
            mem = by[b].memory
            if (mem <= 0 or only_forwards or self.overtake) and self._is_ready(b, m, t):
                if mem <= 0 or only_forwards or self._fits_ahead(d, i):
                    return i
            only_forwards = only_forwards and mem > 0
        return None

    def _fits_ahead(self, d: int, i: int) -> bool:
        """Whether the forward at place i of d's order may run before the backwards ahead of it
        (`overtake`): now, before any W the device owes, it must fit the limit; and the order's
        level with it moved up, each owed W counted as run (the walk runs them before a forward
        that needs their memory, _step) and each later W right after its B, must stay within the
        limit at every allocation up to its old place (from there on the level is the order's
        own). So the order's peak with each W right after its B still bounds the walk's."""
        by, order, cap = self.p.by_id, self.orders[d], self.cap[d] + EPS
        mem = by[order[i][0]].memory
        if self.mem[d] + mem > cap:
            return False
        level = self.mem[d] + sum(by[w].memory for w, _ in self.pending[d]) + mem
        for b, m in order[self.pos[d]:i]:
            level += by[b].memory
            if by[b].memory > 0 and level > cap:
                return False
            if self._spawns(b, m):
                level += by[self.weight[b]].memory
        return True

    def _step(self, d: int) -> None:
        t, order, wait = self.cur[d], self.orders[d], self.pending[d]
        if self.pos[d] == len(order):
            return self._put(d, wait.popleft(), t)
        b, m = order[self.pos[d]]
        blk = self.p.by_id[b]
        if wait and blk.memory > 0 and self.mem[d] + blk.memory > self.cap[d] + EPS:
            return self._put(d, wait.popleft(), t)  # the forward needs the memory a W frees
        r, known = self._ready(b, m)
        near = self.reorder and known and r <= t + EPS and blk.memory > 0
        jump = self._nearer_loss(d, t) if near else None
        soon = self._nearer_soon(d, t) if near and jump is None and self.wait > 0 else None
        if soon is not None:
            self.cur[d] = soon
            return None
        if known and r <= t + EPS and jump is None:
            self.pos[d] += 1
            return self._put(d, (b, m), t)
        # `hold`: a forward due within `wait` of its length keeps its place (one run ahead of it
        # would hold it, and the micro-batch's trip down or back up the V, for its whole length)
        held = self.hold and known and blk.memory > 0 and r <= t + self.wait * blk.duration + EPS
        if jump is None and self.reorder and not held:
            jump = self._ready_later(d, t)
        if jump is not None:
            i = self.pos[d]
            order[i:jump + 1] = [order[jump], *order[i:jump]]
            self.pos[d] += 1
            return self._put(d, order[i], t)
        slack = 0.0 if b in self.urgent else self.slack
        if wait and t + self.p.by_id[wait[0][0]].duration * (1 - slack) <= r + EPS:
            return self._put(d, wait.popleft(), t)
        if r > t + EPS:
            self.cur[d] = r
        else:
            self.parked.add(d)  # its input's device, at this same time, moves first

    def run(self) -> dict[Key, Number] | None:
        # the device moved next: the live one not parked with the least (time, index). A step
        # changes only its own device's time, and parks it or unparks all: a heap of the others
        # (p = 16, N = 32: 3,000 steps a walk, v-mem ~90 walks; a scan of the devices a step was
        # a third of v-mem's build)
        heap = [(self.cur[e], e) for e in range(self.p.devices)]
        held: list[int] = []  # parked, out of the heap until the next task placed unparks them
        steps = 0
        while heap or held:
            steps += 1
            if steps % CHECK_EVERY == 0:
                deadline.check()  # OutOfTime past the deadline the caller set (the race: the search's clock)
            if not heap:
                raise DeadlockError("W-filling walk: every device waits on another")
            _, d = heapq.heappop(heap)
            self._step(d)
            if self.cur[d] + self.work[d] > self.cutoff + EPS:
                return None  # longer than the cutoff whatever comes next
            if not self.parked:
                for e in held:
                    heapq.heappush(heap, (self.cur[e], e))
                held = []
            if self.pos[d] == len(self.orders[d]) and not self.pending[d]:
                continue  # done
            if d in self.parked:
                held.append(d)
            else:
                heapq.heappush(heap, (self.cur[d], d))
        return self.start


def fill_weights(p: Placement, orders: Sequence[Sequence[Key]], weight: dict[str, str],
                 limit: Sequence[Number] | None, cutoff: Number = math.inf,
                 reorder: bool = True, slack: float = 0.0, wait: float = 0.0, overtake: bool = False,
                 urgent: Collection[str] = (), hold: bool = False) -> dict[Key, Number] | None:
    """Start times of the F/B `orders` with each device's W passes that the orders leave out
    filled in (a W the orders list runs where it is); None as soon as the makespan is sure to
    exceed `cutoff`; OutOfTime past a deadline set around the build (tessel.baselines.deadline).
    Without `reorder`, every device runs its order as given (W passes aside).
    A pending W fills a wait that is at least (1 - `slack`) of its length (0: only where it
    delays nothing; 0.5: it may delay the next task by up to half its length). With `wait` > 0,
    a device about to run a ready forward waits up to `wait` of its length for a forward nearer
    the loss among the next ones in its order (_Walk._nearer_soon). With `overtake`, a device
    whose next task is not ready may also run a ready forward a few places on past backwards,
    where the limit allows it (_Walk._fits_ahead). With `hold`, a device whose next task is a
    forward ready within `wait` of its length runs nothing later in its order first (it may run
    a W that fits the wait). Before a block of `urgent` a W fills only a wait it does not
    lengthen (slack 0 there)."""
    return _Walk(p, orders, weight, limit, cutoff, reorder, slack, wait, overtake, urgent, hold).run()
