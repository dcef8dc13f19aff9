"""Lower bounds of FORMAT.md: critical path, per-device head + N * load + tail."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .numeric import EPS
from .placement import Number, Placement


@dataclass(frozen=True)
class Paths:
    """Longest paths of one micro-batch: earliest start of each block and the least time after it."""
    earliest: dict[str, Number]
    tail: dict[str, Number]

    @property
    def critical_path(self) -> Number:
        return max(self.earliest[b] + self.tail[b] for b in self.earliest)


def paths(p: Placement) -> Paths:
    est: dict[str, Number] = {}
    for x in p.topo_order:
        est[x] = max((est[a] + p.by_id[a].duration + p.edge_latency(a, x) for a in p.preds[x]),
                     default=0)
    # tail[x] counts x's own duration: the least time from x's start to the micro-batch's end
    tail: dict[str, Number] = {}
    for x in reversed(p.topo_order):
        tail[x] = p.by_id[x].duration + max(
            (p.edge_latency(x, s) + tail[s] for s in p.succs[x]), default=0)
    return Paths(est, tail)


def device_head_tail(p: Placement, device: int, pt: Paths | None = None) -> tuple[Number, Number]:
    """Earliest any block of `device` can start, and least time that must follow one's end."""
    pt = pt or paths(p)
    on = p.blocks_on(device)
    head = min(pt.earliest[b.id] for b in on)
    tail = min(pt.tail[b.id] - b.duration for b in on)
    return head, tail


def lower_bound(p: Placement, micro_batches: int) -> Number:
    """max(critical path, max over devices of head + N * load + tail)."""
    pt = paths(p)
    lb = pt.critical_path
    for d in range(p.devices):
        if not p.blocks_on(d):
            continue
        head, tail = device_head_tail(p, d, pt)
        lb = max(lb, head + micro_batches * p.loads[d] + tail)
    return lb


def period_lower_bound(p: Placement) -> Number:
    """No steady state repeats faster than the busiest device's load per micro-batch."""
    return max(p.loads)


def hold_time(p: Placement, first: str, last: str) -> Number:
    """Least time from the start of `first` to the end of `last` (a descendant): the longest path."""
    dist: dict[str, Number] = {first: 0}
    for x in p.topo_order:
        if x in dist:
            for y in p.succs[x]:
                dist[y] = max(dist.get(y, 0), dist[x] + p.by_id[x].duration + p.edge_latency(x, y))
    return dist[last] + p.by_id[last].duration


def memory_lower_bound(p: Placement, micro_batches: int, device: int, holds: Sequence[tuple[str, str, Number]],
                       limit: Number) -> Number:
    """Little's law over a whole run: every micro-batch holds `amount` on the device from the
    start of an allocating block to the end of its releasing one, for at least their hold time;
    the memory level never exceeds `limit`, so the memory-time N * sum(amount * hold) fits in
    limit * (the time between the first allocation and the last release), which itself leaves
    the head before and the tail after. With at most k micro-batches' memory in flight, the
    device's period cannot be shorter than what k allow."""
    if not holds or limit <= 0:
        return 0
    pt = paths(p)
    held = sum(amount * hold_time(p, a, r) for a, r, amount in holds)
    head = min(pt.earliest[a] for a, _, _ in holds)
    tail = min(pt.tail[r] - p.by_id[r].duration for _, r, _ in holds)
    return head + micro_batches * held / limit + tail


def shard_lower_bound(p: Placement, micro_batches: int) -> Number:
    """Pipeline fill through blocks on all devices. A block on every device (a sharded
    embedding, a replicated layer) stops every other block while it runs, so the time splits
    into its runs (N times their summed duration) and the rest. In the rest, the other blocks
    keep their dependencies (with the all-device blocks and the latencies taking no time: both
    may hide in the runs), so each device still waits for its first block and after its last:
    makespan >= N * load(all-device blocks) + max over devices of head' + N * load'(d) + tail'."""
    every = {b.id for b in p.blocks if len(b.devices) == p.devices}
    if not every or len(every) == len(p.blocks) or p.devices < 2:
        return 0
    dur = {b.id: (0 if b.id in every else b.duration) for b in p.blocks}
    est: dict[str, Number] = {}
    for x in p.topo_order:
        est[x] = max((est[a] + dur[a] for a in p.preds[x]), default=0)
    tail: dict[str, Number] = {}  # least time after x's end
    for x in reversed(p.topo_order):
        tail[x] = max((dur[s] + tail[s] for s in p.succs[x]), default=0)
    shared = sum(p.by_id[b].duration for b in every)
    best: Number = 0
    for d in range(p.devices):
        own = [b.id for b in p.blocks_on(d) if b.id not in every]
        if own:
            load = sum(dur[b] for b in own)
            best = max(best, min(est[b] for b in own) + micro_batches * load + min(tail[b] for b in own))
    return micro_batches * shared + best


Holds = Sequence[tuple[str, str, Number]]  # (allocating block, releasing block, amount) of one device


def proven_lower_bound(p: Placement, micro_batches: int, memory: Sequence[tuple[int, Holds, Number]] = (),
                       solver: Number | None = None, objective: str = "makespan") -> tuple[Number, str]:
    """The best proven lower bound of a search's objective, and which argument proved it:
    FORMAT.md's (analytic), the fill through all-device blocks (shard), Little's law on each
    limited device's (device, holds, limit) in `memory` (memory), or a `solver` bound proven on
    an exact grid. The span objective (each device's own work) has its own."""
    if objective == "span":
        return max(micro_batches * x for x in p.loads), "analytic"
    best: tuple[Number, str] = (lower_bound(p, micro_batches), "analytic")
    shard = shard_lower_bound(p, micro_batches)
    if shard > best[0] + EPS:
        best = (shard, "shard")
    for d, holds, limit in memory:
        x = memory_lower_bound(p, micro_batches, d, holds, limit)
        if x > best[0] + EPS:
            best = (x, "memory")
    if solver is not None and solver > best[0] + EPS:
        best = (solver, "solver")
    return best
