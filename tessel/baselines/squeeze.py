"""Squeeze a V block in slot time: each task as early as its inputs' slots and its device's memory allow.

A block of tessel.baselines.vmem gives every forward and backward of micro-batch m a nominal unit
slot (its slot in micro-batch 0's block plus INTERVAL * m). Taken in nominal order, each task moves
to the earliest slot of its device that is free and after the slots of its inputs (its micro-batch's
predecessors) and of its own block's previous micro-batch, provided the device's order, each W
right after its B, stays within the memory limit. A backward frees memory, so it moves wherever its
inputs allow; a forward moves only as far up as the levels it overtakes leave room for its
activation. This is the squeeze of Qi et al., "Pipeline Parallelism with Controllable Memory"
(2024), whose V-Min and V-Half schedules are squeezed blocks, done on tessel's orders: the warm-up
builds itself (micro-batches' forwards run down the V as soon as their inputs and the limit allow),
the cool-down's backwards close up, and in the steady state a forward takes a slot the block left to
a W wherever the limit has room for one more activation (the order counts each W right after its B,
the least it can hold). Measured against the block's own warm-up (vmem's early runs) on the zbv
placement under V-Min's memory, profiled costs: p = 8, m = 16, 60.916 -> 57.404 without latency,
64.180 -> 59.460 with (V-Min 60.904 and 64.208).

With the W passes in slots of their own (`weights_slotted`: each in the first free slot after its
B, counted for memory there, moved up like the rest), a forward never takes the slot a W needs to
give its memory back in time; that holds the steady state where the squeeze with each W right
after its B packs the warm-up so full of forwards that micro-batches stall on their way back up
the V: p = 16, m = 32, V-Min's memory, profiled: 124.204 (V-Min 124.508; 125.720 with each W
right after its B), with latency 131.528 (131.896).

Moves only go earlier and never past an input's slot, so every edge still runs forward in slot
order: the orders cannot deadlock. Each check is local: the levels of the tasks a forward overtakes
and the level it starts from (the rest of the order keeps its levels).
"""
from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Sequence

from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from .shapes import Chain

SlotKey = tuple[int, int, int]  # (slot, minus the chain's rank: later in the chain first on ties, micro-batch)


class _Lane:
    """One device's tasks in slot order, with the level at each task's allocation (`top`, minus
    infinity for one that allocates nothing) and after it and its W (`after`)."""

    def __init__(self, p: Placement, c: Chain, tasks: list[tuple[SlotKey, Key]], cap: Number) -> None:
        self.cap = cap
        self.keys = [k for k, _ in tasks]
        self.tasks = [t for _, t in tasks]
        self.used: Counter[int] = Counter(k[0] for k in self.keys)
        blocks = {b for b, _ in self.tasks}
        self.alloc = {b: p.by_id[b].memory for b in blocks}
        self.net = {b: p.by_id[b].memory + (p.by_id[c.weight[b]].memory if b in c.weight else 0) for b in blocks}
        self.top = [0.0] * len(self.tasks)
        self.after = [0.0] * len(self.tasks)
        self._levels(0, len(self.tasks))

    def _levels(self, i: int, j: int) -> None:
        """Levels of places i to j - 1 (those after keep theirs: the same tasks come before them)."""
        level = self.after[i - 1] if i else 0.0
        for k in range(i, j):
            b = self.tasks[k][0]
            a = self.alloc[b]
            self.top[k] = level + a if a > 0 else -float("inf")
            level += self.net[b]
            self.after[k] = level

    def lowest(self, j: int, b: str) -> int:
        """The first place the task at j may move to: none of the tasks it overtakes goes over
        the limit with its net memory counted before them."""
        net, i = self.net[b], j
        if net > 0:
            while i > 0 and self.top[i - 1] + net <= self.cap + EPS:
                i -= 1
        else:
            i = 0
        return i

    def fits_at(self, i: int, b: str) -> bool:
        a = self.alloc[b]
        return a <= 0 or (self.after[i - 1] if i else 0.0) + a <= self.cap + EPS

    def move(self, j: int, key: SlotKey) -> None:
        task = self.tasks.pop(j)
        old = self.keys.pop(j)
        i = bisect.bisect(self.keys, key)
        self.keys.insert(i, key)
        self.tasks.insert(i, task)
        self.used[old[0]] -= 1
        self.used[key[0]] += 1
        self._levels(min(i, j), max(i, j) + 1)


def _slot_weights(at: dict[Key, int], c: Chain, dev: dict[str, int]) -> None:
    """Give each W a slot: on its device, the first one no task holds after its B's, the oldest
    pending W first (a W left over past the device's last task goes after it)."""
    lanes: dict[int, list[tuple[int, Key]]] = {}
    for t, s in at.items():
        lanes.setdefault(dev[t[0]], []).append((s, t))
    for tasks in lanes.values():
        tasks.sort()
        held = {s for s, _ in tasks}
        pending: deque[Key] = deque()
        i, s = 0, 0
        while i < len(tasks) or pending:
            while i < len(tasks) and tasks[i][0] <= s:
                b, m = tasks[i][1]
                i += 1
                if b in c.weight:
                    pending.append((c.weight[b], m))
            if pending and s not in held:
                at[pending.popleft()] = s
            s += 1


def squeeze_orders(p: Placement, c: Chain, n: int, slot: dict[str, int], rank: dict[str, int], interval: int,
                   limit: Sequence[Number] | None, weights_slotted: bool = False) -> list[list[Key]]:
    """Each device's F/B order of the block `slot` (micro-batch m `interval` slots after m - 1),
    squeezed under `limit` (see the module doc), each B followed by its W. With `weights_slotted`,
    the W passes take slots too (_slot_weights) and count for memory where they stand, and move up
    like the other tasks (after their B): a forward then never takes the slot a W needs to free
    its memory in time."""
    at = {(b, m): slot[b] + interval * m for b in slot for m in range(n)}
    dev = {b: c.device(p, b) for b in slot}
    rank = dict(rank)
    counted = c
    if weights_slotted:
        dev.update({w: dev[b] for b, w in c.weight.items()})
        rank.update({w: rank[b] for b, w in c.weight.items()})
        _slot_weights(at, c, dev)
        counted = Chain(c.forward, c.backward, {})  # each W counts at its own place
    key = {t: (s, -rank[t[0]], t[1]) for t, s in at.items()}
    order = sorted(at, key=key.__getitem__)
    cap = list(limit) if limit is not None else [float("inf")] * p.devices
    by_device: list[list[tuple[SlotKey, Key]]] = [[] for _ in range(p.devices)]
    for t in order:
        by_device[dev[t[0]]].append((key[t], t))
    lanes = [_Lane(p, counted, tasks, cap[d]) for d, tasks in enumerate(by_device)]
    for t in order:
        b, m = t
        lane = lanes[dev[b]]
        earliest = max([at[(a, m)] + 1 for a in p.preds[b] if (a, m) in at] + [at[(b, m - 1)] + 1 if m else 0])
        j = bisect.bisect_left(lane.keys, key[t])
        i = lane.lowest(j, b)
        s = max(earliest, lane.keys[i - 1][0] + 1 if i else earliest)
        while s < at[t]:
            if not lane.used[s]:
                k = bisect.bisect(lane.keys, (s, -rank[b], m))
                if lane.fits_at(k, b):
                    break
            s += 1
        if s < at[t]:
            at[t] = s
            key[t] = (s, -rank[b], m)
            lane.move(j, key[t])
    late = set(c.weight.values())
    return [[x for b, m in lane.tasks if b not in late
             for x in ([(b, m), (c.weight[b], m)] if b in c.weight else [(b, m)])] for lane in lanes]
