"""Lower bounds of FORMAT.md: critical path, per-device head + N * load + tail; the fill through
all-device blocks; Little's law on a memory limit; and one device at a time with every task's
own release and tail, where latency and memory limits delay the k-th micro-batch
(device_lower_bound)."""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from . import graph
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


# ---- one device at a time, every task with its own release and tail ----------------------------
STAGGER_TASKS = 200_000  # most (task, device) pairs the per-copy releases are worked out for


def staggered_releases(p: Placement, micro_batches: int,
                       floor: Mapping[str, Sequence[Number]] | None = None) -> dict[str, list[Number]]:
    """r[b][k]: the least start of the k-th task of block b in time order (k = 0 .. N-1).

    Valid for every schedule, by three arguments:
    - inputs: the first k+1 tasks of b belong to k+1 micro-batches whose tasks of an input a
      are k+1 distinct tasks of a, one of them at least the k-th to start; so
      r[b][k] >= r[a][k] + duration(a) + latency(a, b);
    - itself: the tasks of b run one after another, so r[b][k] >= r[b][k-1] + duration(b);
    - its device: before the k-th task of b starts, each device d of b ran k tasks of b and, of
      every ancestor of b on d, the k+1 tasks of those micro-batches, none before the earliest
      of their first starts (up to RATE_BLOCKS blocks: ancestor sets cost their square).
    r[b][0] is the earliest start (the longest path, latency included)."""
    return _staggered(p, micro_batches, p.topo_order, p.preds,
                      lambda a, x: p.by_id[a].duration + p.edge_latency(a, x), graph.ancestors, floor)


def staggered_tails(p: Placement, micro_batches: int) -> dict[str, list[Number]]:
    """q[b][k]: the least time after the end of the k-th last task of b to end (k = 0: the last
    one); the mirror image of staggered_releases, outputs for inputs, by the same arguments."""
    return _staggered(p, micro_batches, tuple(reversed(p.topo_order)), p.succs,
                      lambda s, x: p.by_id[s].duration + p.edge_latency(x, s), graph.ancestors)


RATE_BLOCKS = 2000  # most blocks for the device term of the staggered releases and tails


def _staggered(p: Placement, n: int, order: Sequence[str], before: Mapping[str, Sequence[str]],
               gap: Callable[[str, str], Number],
               closure: Callable[[Sequence[str], Mapping[str, Sequence[str]]], Mapping[str, frozenset[str]]],
               floor: Mapping[str, Sequence[Number]] | None = None) -> dict[str, list[Number]]:
    """The recursion of staggered_releases along `order` (`before`: the blocks that come first),
    each value at least its `floor` (bounds proven another way)."""
    near = closure(order, before) if len(order) <= RATE_BLOCKS else None
    r: dict[str, list[Number]] = {}
    for x in order:
        b = p.by_id[x]
        row: list[Number] = list(floor[x]) if floor is not None and x in floor else [0] * n
        for a in before[x]:
            g, ra = gap(a, x), r[a]
            for k in range(n):
                row[k] = max(row[k], ra[k] + g)
        if near is not None:
            for d in b.devices:
                on = [a for a in near[x] if d in p.by_id[a].devices]
                if on:
                    first = min([row[0], *(r[a][0] for a in on)])
                    work = sum(p.by_id[a].duration for a in on)
                    for k in range(n):
                        row[k] = max(row[k], first + (k + 1) * work + k * b.duration)
        for k in range(1, n):
            row[k] = max(row[k], row[k - 1] + b.duration)
        r[x] = row
    return r


def one_machine_bound(jobs: Sequence[tuple[Number, Number, Number]]) -> Number:
    """The least makespan of jobs (release, duration, tail) on one machine when a job may be
    interrupted (Jackson's preemptive schedule: always the released job with the longest tail;
    optimal for the relaxation, so a lower bound of the uninterrupted problem). Equal to the
    largest min release + summed durations + min tail over any set of the jobs (Carlier)."""
    order = sorted(jobs, key=lambda j: j[0])
    ready: list[tuple[Number, int, Number]] = []  # (-tail, index, work left)
    best: Number = 0
    t: Number = 0
    i = 0
    while i < len(order) or ready:
        if not ready and order[i][0] > t:
            t = order[i][0]
        while i < len(order) and order[i][0] <= t:
            rel, dur, tail = order[i]
            heapq.heappush(ready, (-tail, i, dur))
            i += 1
        neg_tail, j, left = heapq.heappop(ready)
        until = order[i][0] if i < len(order) else None
        if until is not None and t + left > until:  # runs until the next release, then competes again
            heapq.heappush(ready, (neg_tail, j, left - (until - t)))
            t = until
        else:
            t += left
            best = max(best, t - neg_tail)
    return best


Holds = Sequence[tuple[str, str, Number]]  # (allocating block, releasing block, amount) of one micro-batch
MEMORY_PASSES = 3  # rounds of memory-delayed releases (each uses the previous round's releases)


def device_lower_bound(p: Placement, micro_batches: int,
                       memory: Mapping[int, tuple[Number, Holds]] | None = None) -> Number:
    """max over devices of the one-machine bound of its N x blocks tasks, each task with its own
    release and tail (staggered_releases / staggered_tails: the k-th task of a block to start
    is the (N-1-k)-th last to end, as a block's tasks on a device run one after another).
    `memory` maps a device to its limit and its holds (as memory_lower_bound): then a task that
    allocates also waits for enough releases (memory_releases).

    It is at least lower_bound(): the set of all of a device's tasks gives head + N * load +
    tail, and one micro-batch's path through a device gives the critical path. Where latency
    matters it adds what head + N * load + tail misses: a block whose first task must wait for
    a round trip through other devices (the V's backward after its forward) splits the
    device's work, and the part after the wait cannot start before it; with a memory limit,
    the device can run only so many forwards before the first round trip's releases come back.
    Above STAGGER_TASKS (task, device) pairs, every task of a block shares its head and tail."""
    n = micro_batches
    pairs = n * sum(len(b.devices) for b in p.blocks)
    if pairs <= STAGGER_TASKS:
        r = staggered_releases(p, n)
        if memory and len(p.blocks) <= RATE_BLOCKS:
            r = memory_releases(p, n, memory, r)
        q = staggered_tails(p, n)
        jobs_of = {b.id: [(r[b.id][k], b.duration, q[b.id][n - 1 - k]) for k in range(n)] for b in p.blocks}
    else:
        pt = paths(p)
        jobs_of = {b.id: [(pt.earliest[b.id], n * b.duration, pt.tail[b.id] - b.duration)] for b in p.blocks}
    best: Number = 0
    for d in range(p.devices):
        on = p.blocks_on(d)
        if on:
            best = max(best, one_machine_bound([j for b in on for j in jobs_of[b.id]]))
    return best


def memory_releases(p: Placement, micro_batches: int, memory: Mapping[int, tuple[Number, Holds]],
                    r: dict[str, list[Number]]) -> dict[str, list[Number]]:
    """Staggered releases that also wait for memory. When the k-th task of an allocating block a
    starts, at time t, the k+1 micro-batches that started a each hold every amount x of a hold
    (a', r') with a' = a or an ancestor of a until their task of r' ends; at most E(r', t) of
    them have, where E counts the tasks of r' whose least end (r[r'][j] + duration) is <= t
    (releases count first at equal times). So sum x * max(0, k + 1 - E(r', t)) <= limit, and
    the least such t is a release of that task. Each round uses the previous round's releases
    (all valid lower bounds), and the recursion then carries the delays to every descendant."""
    n = micro_batches
    anc = graph.ancestors(p.topo_order, p.preds)
    for _ in range(MEMORY_PASSES):
        floor: dict[str, list[Number]] = {}
        for limit, holds in memory.values():
            for a in {a for a, _, _ in holds}:
                mine = [(rel, x) for a2, rel, x in holds if a2 == a or a2 in anc[a]]
                row = _memory_delays(p, n, limit, mine, r[a], r)
                floor[a] = [max(u, v) for u, v in zip(floor.get(a, row), row)]
        if all(floor[a] == r[a] for a in floor):
            break
        r = staggered_releases(p, n, floor)
    return r


def _memory_delays(p: Placement, n: int, limit: Number, holds: Sequence[tuple[str, Number]],
                   start: Sequence[Number], r: Mapping[str, Sequence[Number]]) -> list[Number]:
    """Per k, the least t >= start[k] with sum x * max(0, k + 1 - E(rel, t)) <= limit."""
    ends = {rel: [t + p.by_id[rel].duration for t in r[rel]] for rel, _ in holds}
    times = sorted({t for e in ends.values() for t in e})
    out: list[Number] = []
    i = 0

    def held(k: int, t: Number) -> Number:
        return sum(x * max(0, k + 1 - bisect_right(ends[rel], t)) for rel, x in holds)
    for k in range(n):
        # the least t is start[k] or one of the ends; held() falls with t and rises with k,
        # so the index into the ends only moves forward as k grows
        if held(k, start[k]) <= limit + EPS_MEMORY:
            out.append(start[k])
            continue
        while i < len(times) and (times[i] <= start[k] or held(k, times[i]) > limit + EPS_MEMORY):
            i += 1
        out.append(times[i] if i < len(times) else start[k])  # past the last end nothing is held
    return out


EPS_MEMORY = 1e-9
