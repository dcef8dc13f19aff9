"""From per-device task orders to start times: every task as early as its inputs and its devices allow.

Baselines decide orders and let this module place them in time; the simulator replays a searched
schedule's orders with other durations; the runtime's deadlock check is the same walk.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
    """
    check_orders(p, micro_batches, orders)
    by = p.by_id
    durations = {b.id: b.duration for b in p.blocks}
    dur = duration or (lambda b, m: durations[b])
    lat = latency or p.edge_latency
    # per block, looked up once: linear in tasks with small constants (524k tasks at 4,096 devices)
    devices = {b.id: by[b.id].devices for b in p.blocks}
    inputs = {b.id: [(a, lat(a, b.id)) for a in p.preds[b.id]] for b in p.blocks}
    succs = p.succs
    pos = [0] * p.devices
    free: list[Number] = [0] * p.devices
    end: dict[Key, Number] = {}
    start: dict[Key, Number] = {}
    total = sum(len(o) for o in orders)
    done = 0
    # a task is issued when it heads the order of every one of its devices (counted as each
    # device reaches it: a task on k devices costs k, not k squared) and its inputs are done
    heap: list[tuple[Number, int, Key]] = []
    heads: dict[Key, int] = {}
    queued: set[Key] = set()

    def try_queue(key: Key) -> None:
        b, m = key
        if key in queued or heads.get(key, 0) < len(devices[b]):
            return
        t: Number = 0
        for d in devices[b]:
            if free[d] > t:
                t = free[d]
        for a, la in inputs[b]:
            e = end.get((a, m))
            if e is None:
                return
            if e + la > t:
                t = e + la
        queued.add(key)
        heapq.heappush(heap, (t, len(queued), key))

    def arrive(d: int) -> None:
        """Device d moved on to the next task of its order."""
        if pos[d] < len(orders[d]):
            key = orders[d][pos[d]]
            heads[key] = heads.get(key, 0) + 1
            try_queue(key)

    for d in range(p.devices):
        arrive(d)
    while heap:
        t, _, key = heapq.heappop(heap)
        b, m = key
        start[key] = t
        end[key] = e = t + dur(b, m)
        del heads[key]
        devs = devices[b]
        done += len(devs)
        for d in devs:
            pos[d] += 1
            free[d] = e
        for d in devs:
            arrive(d)
        for s in succs[b]:
            try_queue((s, m))
    if done != total:
        raise DeadlockError(_deadlock_message(p, orders, pos, end))
    return start


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
    starts = earliest_starts(p, micro_batches, orders)
    return Schedule.build(p, micro_batches, starts, memory_limit, repetend, meta, check)


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
