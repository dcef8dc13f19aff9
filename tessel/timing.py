"""From per-device task orders to start times: every task as early as its inputs and its devices allow.

Baselines decide orders and let this module place them in time; the simulator replays a searched
schedule's orders with other durations; the runtime's deadlock check is the same walk.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from itertools import count
from typing import Any

from .bulk import paused_gc
from .dust import settle
from .key import Key
from .placement import Number, Placement
from .schedule import Repetend, Schedule, ScheduleError

Orders = Sequence[Sequence[Key]]


class DeadlockError(ScheduleError):
    """Per-device orders that wait on each other in a cycle."""


def check_orders(p: Placement, micro_batches: int, orders: Orders) -> None:
    """Each device lists exactly the tasks of its blocks, each once; a multi-device task on each of its devices."""
    if len(orders) != p.devices:
        raise ScheduleError(f"{len(orders)} device orders for {p.devices} devices")
    for d, order in enumerate(orders):
        want = {(b.id, m) for b in p.blocks_on(d) for m in range(micro_batches)}
        got = list(order)
        if len(got) != len(set(got)) or set(got) != want:
            extra = sorted(set(got) - want)[:1]
            missing = sorted(want - set(got))[:1]
            dup = len(got) - len(set(got))
            raise ScheduleError(f"device {d} order: {dup} repeated, extra {extra}, missing {missing}")


def earliest_starts(p: Placement, micro_batches: int, orders: Orders,
                    duration: Callable[[str, int], Number] | None = None,
                    latency: Callable[[str, str], Number] | None = None) -> dict[Key, Number]:
    """Start times when every device runs its order back to back, waiting only for inputs.

    `duration(block, mb)` and `latency(a, b)` default to the placement's; the simulator passes
    perturbed ones. Raises DeadlockError naming the devices and tasks that wait on each other.
    Tasks are issued in time order (ties: the first ready first), which is the order of the
    returned dict.
    """
    with paused_gc():  # a million small objects and no cycle among them (tessel.bulk)
        return _earliest_starts(p, micro_batches, orders, duration, latency)


def _earliest_starts(p: Placement, n: int, orders: Orders, duration: Callable[[str, int], Number] | None,
                     latency: Callable[[str, str], Number] | None) -> dict[Key, Number]:
    ids = [b.id for b in p.blocks]
    index = {b: i for i, b in enumerate(ids)}
    seq = _task_ids(p, n, orders, index)
    lat = latency or p.edge_latency
    # a task is block index i * n + micro-batch: lists, not dicts of tuple keys (524k tasks at 4,096 devices)
    devices = [p.by_id[b].devices for b in ids]
    width = [len(x) for x in devices]
    inputs = [[(index[a] * n, lat(a, b)) for a in p.preds[b]] for b in ids]
    succs = [[index[x] for x in p.succs[b]] for b in ids]
    block_duration = [p.by_id[b].duration for b in ids]
    pos = [0] * p.devices
    free: list[Number] = [0] * p.devices
    end: list[Number | None] = [None] * (len(ids) * n)
    heads = [0] * len(end)
    queued = bytearray(len(end))
    start: dict[Key, Number] = {}
    done, counter = 0, count()
    # a task is issued when it heads the order of every one of its devices (counted as each
    # device reaches it: a task on k devices costs k, not k squared) and its inputs are done
    heap: list[tuple[Number, int, int, int]] = []

    def try_queue(i: int, m: int) -> None:
        tid = i * n + m
        if queued[tid] or heads[tid] < width[i]:
            return
        t: Number = 0
        for d in devices[i]:
            if free[d] > t:
                t = free[d]
        for base, la in inputs[i]:
            e = end[base + m]
            if e is None:
                return
            if e + la > t:
                t = e + la
        queued[tid] = 1
        heapq.heappush(heap, (t, next(counter), i, m))

    def arrive(d: int) -> None:
        """Device d moved on to the next task of its order."""
        if pos[d] < len(seq[d]):
            tid = seq[d][pos[d]]
            heads[tid] += 1
            try_queue(*divmod(tid, n))

    for d in range(p.devices):
        arrive(d)
    while heap:
        t, _, i, m = heapq.heappop(heap)
        start[(ids[i], m)] = t
        end[i * n + m] = e = t + (block_duration[i] if duration is None else duration(ids[i], m))
        devs = devices[i]
        done += len(devs)
        for d in devs:
            pos[d] += 1
            free[d] = e
        for d in devs:
            arrive(d)
        for x in succs[i]:
            try_queue(x, m)
    if done != sum(len(o) for o in seq):
        raise DeadlockError(_deadlock_message(p, orders, pos, start))
    return start


def _task_ids(p: Placement, n: int, orders: Orders, index: Mapping[str, int]) -> list[list[int]]:
    """Each device's order as task ids (block index * n + micro-batch), checked as check_orders
    does in one pass: every entry a task of the device, none twice, as many as it has tasks."""
    if len(orders) != p.devices:
        check_orders(p, n, orders)
    on = [frozenset(p.by_id[b].devices) for b in index]
    mark = [-1] * (len(index) * n)
    out = []
    for d, order in enumerate(orders):
        ids = []
        for b, m in order:
            i = index.get(b)
            if i is None or type(m) is not int or not 0 <= m < n or d not in on[i] or mark[i * n + m] == d:
                check_orders(p, n, orders)  # says what is wrong
                raise ScheduleError(f"device {d} order: bad entry {(b, m)!r}")
            mark[i * n + m] = d
            ids.append(i * n + m)
        if len(ids) != len(p.blocks_on(d)) * n:
            check_orders(p, n, orders)
        out.append(ids)
    return out


def _deadlock_message(p: Placement, orders: Orders, pos: list[int], end: Mapping[Key, Number]) -> str:
    stuck = []
    for d in range(p.devices):
        if pos[d] < len(orders[d]):
            b, m = orders[d][pos[d]]
            waits = [f"{a}#{m}" for a in p.preds[b] if (a, m) not in end]
            others = [f"device {e}" for e in p.by_id[b].devices
                      if e != d and (pos[e] >= len(orders[e]) or orders[e][pos[e]] != (b, m))]
            stuck.append(f"device {d} waits at {b}#{m} for {', '.join(waits + others) or '?'}")
    return "orders deadlock: " + "; ".join(stuck)


def schedule_from_orders(p: Placement, micro_batches: int, orders: Orders,
                         memory_limit: Number | Sequence[Number] | None = None,
                         repetend: Repetend | None = None, meta: Mapping[str, Any] | None = None,
                         check: bool = True) -> Schedule:
    """The validated schedule that runs each device's order as early as possible."""
    return settled(p, micro_batches, earliest_starts(p, micro_batches, orders), memory_limit, repetend, meta, check)


def settled(p: Placement, micro_batches: int, starts: Mapping[Key, Number],
            memory_limit: Number | Sequence[Number] | None = None, repetend: Repetend | None = None,
            meta: Mapping[str, Any] | None = None, check: bool = True) -> Schedule:
    """Schedule.build of starts summed from costs, with its float dust settled: a start snapped
    to an integer (26.99999999999999 -> 27) ends a release a hair after the allocation the sums
    timed right at its end, one activation over the limit by rule 4 (tessel.dust)."""
    s = Schedule.build(p, micro_batches, starts, memory_limit, repetend, meta, check=False)
    if moved := settle(p, s.tasks):
        s = Schedule.build(p, micro_batches, {**s.start, **moved}, memory_limit, s.repetend, meta, check=False)
    return s.validate() if check else s


def orders_of(s: Schedule) -> list[list[Key]]:
    """Per-device orders of an existing schedule (start order; ties by micro-batch, block)."""
    return orders_from_starts(s.placement, s.start)


def orders_from_starts(p: Placement, starts: Mapping[Key, Number]) -> list[list[Key]]:
    """Per-device orders of start times (start order; ties by micro-batch, block)."""
    orders: list[list[tuple[Number, int, str]]] = [[] for _ in range(p.devices)]
    for (b, m), t in starts.items():
        for d in p.by_id[b].devices:
            orders[d].append((t, m, b))
    return [[(b, m) for _, m, b in sorted(o)] for o in orders]


def span(p: Placement, starts: Mapping[Key, Number]) -> Number:
    """The makespan of `starts`: the latest end (starts at 0 or later)."""
    return max(t + p.by_id[b].duration for (b, _), t in starts.items())


def order_peak(p: Placement, order: Sequence[Key]) -> Number:
    """A device's peak memory running `order`: one task at a time, so its memory is the running sum
    (releases at task ends come before the next task's allocation: rule 4). Depends on the order
    alone, so a baseline's fit is known before it is timed."""
    level: Number = 0
    peak: Number = 0
    for b, _ in order:
        mem = p.by_id[b].memory
        level += mem
        if mem > 0 and level > peak:
            peak = level
    return peak


def input_ready(p: Placement, b: str, m: int, end: Mapping[Key, Number], device: Mapping[str, int],
                free: Sequence[Number]) -> tuple[Number, bool]:
    """Earliest start of (b, m) by its inputs, and whether that time is known: an input not yet
    placed counts as starting when its device is `free`, a lower bound."""
    t: Number = 0
    known = True
    for a in p.preds[b]:
        lat = p.edge_latency(a, b)
        if (a, m) in end:
            t = max(t, end[(a, m)] + lat)
        else:
            known = False
            t = max(t, free[device[a]] + p.by_id[a].duration + lat)
    return t, known
