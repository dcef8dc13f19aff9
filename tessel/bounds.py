"""Lower bounds of FORMAT.md: critical path, per-device head + N * load + tail; the fill through
all-device blocks; Little's law on a memory limit; and one device at a time with every task's
own release and tail, where latency and memory limits delay the k-th micro-batch
(device_lower_bound)."""
from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import graph
from .holds import Cycle, Floor, device_ramp, holds_of, memory_cycles, one_machine_end, release_floors
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


def memory_lower_bound(p: Placement, micro_batches: int, device: int, holds: Sequence[tuple[str, str, Number]],
                       limit: Number, pt: Paths | None = None,
                       hold: Callable[[str, str], Number] | None = None) -> Number:
    """Little's law over a whole run: every micro-batch holds `amount` on the device from the
    start of an allocating block to the end of its releasing one, for at least their hold time;
    the memory level never exceeds `limit`, so the memory-time N * sum(amount * hold) fits in
    limit * (the time between the first allocation and the last release), which itself leaves
    the head before and the tail after. With at most k micro-batches' memory in flight, the
    device's period cannot be shorter than what k allow."""
    if not holds or limit <= 0:
        return 0
    pt = pt or paths(p)
    hold = hold or holds_of(p, len(holds))
    held = sum(amount * hold(a, r) for a, r, amount in holds)
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
                       solver: Number | None = None, objective: str = "makespan",
                       device: Number | None = None) -> tuple[Number, str]:
    """The best proven lower bound of a search's objective, and which argument proved it:
    FORMAT.md's (analytic), the fill through all-device blocks (shard), Little's law on each
    limited device's (device, holds, limit) in `memory` (memory), one device at a time with
    every task's own release and tail, latency and memory included (device: device_lower_bound,
    worked out here unless given), or a `solver` bound proven on an exact grid. The span
    objective (each device's own work) has its own."""
    if objective == "span":
        return max(micro_batches * x for x in p.loads), "analytic"
    best: tuple[Number, str] = (lower_bound(p, micro_batches), "analytic")
    shard = shard_lower_bound(p, micro_batches)
    if shard > best[0] + EPS:
        best = (shard, "shard")
    pt, hold = paths(p), holds_of(p, sum(len(holds) for _, holds, _ in memory))  # once: linear per device
    for d, holds, limit in memory:
        x = memory_lower_bound(p, micro_batches, d, holds, limit, pt, hold)
        if x > best[0] + EPS:
            best = (x, "memory")
    if device is None:
        device = device_lower_bound(p, micro_batches, {d: (limit, holds) for d, holds, limit in memory})
    if device > best[0] + EPS:
        best = (device, "device")
    if solver is not None and solver > best[0] + EPS:
        best = (solver, "solver")
    return best


# ---- one device at a time, every task with its own release and tail ----------------------------
STAGGER_TASKS = 20_000  # most (task, device) pairs the per-copy releases are worked out for (a fraction of a second)


Memory = Mapping[int, tuple[Number, Holds]]  # device -> (its limit, its holds)
Vec = np.ndarray[Any, np.dtype[np.float64]]  # one value per micro-batch
Rows = dict[str, Vec]  # per block
RATE_BLOCKS = 2000  # most blocks for the device term of the staggered releases and tails
JOB_GROUPS = 48  # a block's tasks on a device as at most this many jobs of the one-machine bound
EPS_MEMORY = 1e-9  # a release counted as ended a hair early: that only lowers the bound
DEVICE_TERM_WORK = 30_000  # most (micro-batches**2 x ancestors on a block's device) for the device term with memory
# (the search's default: a few hundredths of a second; the relaxation, which spends seconds, takes RELAX_TERM_WORK)
RELAX_TERM_WORK = 4_000_000


def staggered_releases(p: Placement, micro_batches: int, memory: Memory | None = None,
                       term_work: int = DEVICE_TERM_WORK) -> Rows:
    """r[b][k]: the least start of the k-th task of block b in time order (k = 0 .. N-1).

    Valid for every schedule, by four arguments:
    - inputs: the first k+1 tasks of b belong to k+1 micro-batches whose tasks of an input a
      are k+1 distinct tasks of a, one of them at least the k-th to start; so
      r[b][k] >= r[a][k] + duration(a) + latency(a, b);
    - itself: the tasks of b run one after another, so r[b][k] >= r[b][k-1] + duration(b);
    - its device: before the k-th task of b starts, each device d of b ran k tasks of b and, of
      every ancestor of b on d, the k+1 tasks of those micro-batches, none before the earliest
      of their first starts (up to RATE_BLOCKS blocks: ancestor sets cost their square); with
      `memory`, the j-th of each no earlier than its own least start, memory delays included
      (_device_term, up to DEVICE_TERM_WORK);
    - memory (`memory`: per device its limit and holds, as memory_lower_bound): when the k-th
      task of an allocating block a starts, at time t, the k+1 micro-batches that started a each
      hold every amount x of a hold (a', r') with a' = a or an ancestor of a until their task of
      r' ends, and at most E(r', t) of them have: the tasks of r' whose least end is <= t
      (releases count first at equal times). So sum x * max(0, k + 1 - E(r', t)) <= limit,
      and r[a][k] is at least the least such t. This is where latency meets memory: the k-th
      forward waits for the releases of the backwards a round trip away.
      The device also runs the tasks that give that memory back, and the allocations that wait
      for them, before t (holds.release_floors).
    r[b][0] is at least the earliest start (the longest path, latency included)."""
    return _staggered(p, micro_batches, p.topo_order, p.preds,
                      lambda a, x: p.by_id[a].duration + p.edge_latency(a, x), memory, term_work)


def staggered_tails(p: Placement, micro_batches: int, memory: Memory | None = None,
                    term_work: int = DEVICE_TERM_WORK) -> Rows:
    """q[b][k]: the least time after the end of the k-th last task of b to end (k = 0: the last
    one); staggered_releases of the schedule read backwards in time: outputs for inputs, and a
    hold (a, r) taken at r's end and given back at a's start. The memory argument holds as is
    backwards: just before the k-th last task of r ends, the k+1 micro-batches whose r has not
    ended hold x for every hold (a', r') with r' = r or a descendant of r whose a' had started,
    and the tasks of a' that start at or after that time are at most those whose least time
    after their start (q + duration) fits."""
    back = None if memory is None else {d: (limit, [(r, a, x) for a, r, x in holds])
                                        for d, (limit, holds) in memory.items()}
    return _staggered(p, micro_batches, tuple(reversed(p.topo_order)), p.succs,
                      lambda s, x: p.by_id[s].duration + p.edge_latency(x, s), back, term_work)


def _staggered(p: Placement, n: int, order: Sequence[str], before: Mapping[str, Sequence[str]],
               gap: Callable[[str, str], Number], memory: Memory | None, term_work: int) -> Rows:
    """The recursion of staggered_releases along `order` (`before`: the blocks that come first):
    without memory, all micro-batches at once; with it, micro-batch by micro-batch, as a memory
    delay of the k-th task needs the releases' earlier tasks."""
    near = graph.ancestors(order, before) if len(order) <= RATE_BLOCKS else None
    r = _propagate(p, n, order, before, gap, near)
    waits = _memory_waits(memory, near) if memory and near is not None else {}
    if not waits or near is None:
        return r
    floors = release_floors(p, memory or {}, near, {x: float(row[0]) for x, row in r.items()})
    return _with_memory(p, n, order, before, gap, r, near, waits, _same_device(p, order, near, n, term_work), floors,
                        memory_cycles(p, memory or {}, near, n))


def _with_memory(p: Placement, n: int, order: Sequence[str], before: Mapping[str, Sequence[str]],
                 gap: Callable[[str, str], Number], base: Rows, near: Mapping[str, frozenset[str]],
                 waits: Mapping[str, Sequence[tuple[Number, Sequence[tuple[str, Number]]]]],
                 same: Mapping[str, Sequence[Sequence[str]]], floors: Mapping[str, Sequence[Floor]],
                 cycles: Mapping[str, Sequence[Cycle]]) -> Rows:
    """The values of `base` (every argument but memory) raised by the memory argument, k by k
    (the releases' least ends, and the device's work to give memory back: holds.release_floors):
    for each k, in `order`, the inputs' and its own earlier task's values carry every delay on.
    A release that comes after the allocating block (a descendant) has not ended for the
    micro-batch that starts it now: at most k of the k+1 have (the last field of a hold); and what
    the device runs before the memory comes back (holds.memory_cycles)."""
    pos = {x: i for i, x in enumerate(order)}  # a block before x in `order` has its k-th value already
    dur = {x: p.by_id[x].duration for x in order}
    gaps = {x: [(a, gap(a, x)) for a in before[x]] for x in order}
    low = {x: base[x].tolist() for x in order}
    r: dict[str, list[float]] = {x: [] for x in order}
    ends: dict[str, list[float]] = {x: [] for x in order}  # r + duration, as worked out
    # per allocating block and device: limit, all its holds' amounts, (release, amount, worked out
    # before it in a round, a descendant of it)
    plan = {x: [(limit, sum(amount for _, amount in holds),
                 [(rel, amount, pos[rel] < pos[x], x in near[rel]) for rel, amount in holds])
                for limit, holds in lists] for x, lists in waits.items()}
    jobs: dict[tuple[str, int], tuple[list[float], list[float]]] = {}  # (block, device): its device term's jobs
    for k in range(n):
        for x in order:
            t = max(low[x][k], r[x][k - 1] + dur[x]) if k else low[x][0]
            for a, g in gaps[x]:
                t = max(t, r[a][k] + g)
            for i, on in enumerate(same[x]):
                t = max(t, _device_term(jobs.setdefault((x, i), ([], [])), on, x, k, r, dur))
            bare = t  # before the memory holds it back
            for floor in floors.get(x, ()):
                t = max(t, floor.wait(k))
            for limit, total, holds in plan.get(x, ()):
                if (k + 1) * total <= limit:  # all k+1 micro-batches fit whatever has ended
                    continue
                t = _memory_wait(k, t, limit, [
                    (ends[rel], amount,
                     None if known else (max(low[rel][k], ends[rel][-1]) if k else low[rel][0]) + dur[rel],
                     k if after else k + 1)
                    for rel, amount, known, after in holds])
            for cycle in cycles.get(x, ()) if t > bare else ():  # only where the memory holds it back (cost)
                t = max(t, cycle.wait(k, lambda b, lo, hi: r[b][lo:hi] if len(r[b]) >= hi else [
                    *r[b][lo:], max(low[b][hi - 1], r[b][-1] + dur[b]) if hi > 1 else low[b][0]], dur))
            r[x].append(t)
            ends[x].append(t + dur[x])
    return {x: np.array(row, dtype=np.float64) for x, row in r.items()}


def _same_device(p: Placement, order: Sequence[str], near: Mapping[str, frozenset[str]],
                 n: int, term_work: int) -> dict[str, list[list[str]]]:
    """Per block, per device of it, its ancestors there: the device term of _with_memory, where the
    device runs them one after another from their own (memory-delayed) releases; none above
    `term_work` (its jobs grow with the square of the micro-batches)."""
    same = {x: [[a for a in near[x] if d in p.by_id[a].devices] for d in p.by_id[x].devices] for x in order}
    work = n * n * sum(len(on) + 1 for lists in same.values() for on in lists)
    return same if work <= term_work else {x: [] for x in order}


def _device_term(jobs: tuple[list[float], list[float]], on: Sequence[str], x: str, k: int,
                 r: Mapping[str, list[float]], dur: Mapping[str, Number]) -> float:
    """The least start of the k-th task of x by its device d: before it, d ran k tasks of x and, of
    every ancestor a of x on d (`on`), k+1 tasks (those of the micro-batches of x's first k+1),
    one after another, the j-th of each no earlier than r[a][j] (r[x][j]), memory delays
    included. So it is at least the least time one machine ends those jobs (holds.one_machine_end);
    staggered_releases' device term with every release instead of the first. `jobs`: the
    releases and durations so far (k-1), extended here."""
    if not on:
        return 0.0
    rel, work = jobs
    rel += [r[a][k] for a in on] + ([r[x][k - 1]] if k else [])
    work += [float(dur[a]) for a in on] + ([float(dur[x])] if k else [])
    return one_machine_end(rel, work)


def _propagate(p: Placement, n: int, order: Sequence[str], before: Mapping[str, Sequence[str]],
               gap: Callable[[str, str], Number], near: Mapping[str, frozenset[str]] | None) -> Rows:
    """The first three arguments over all micro-batches at once."""
    k = np.arange(n, dtype=np.float64)
    r: Rows = {}
    for x in order:
        b = p.by_id[x]
        row = np.zeros(n)
        for a in before[x]:
            np.maximum(row, r[a] + gap(a, x), out=row)
        for d in b.devices if near is not None else ():
            on = [a for a in near[x] if d in p.by_id[a].devices]  # type: ignore[index]
            if on:
                first = min(row[0], *(r[a][0] for a in on))
                work = sum(p.by_id[a].duration for a in on)
                np.maximum(row, first + (k + 1) * work + k * b.duration, out=row)
        # r[k] >= r[k-1] + duration: a running maximum of r[k] - k * duration
        r[x] = np.maximum.accumulate(row - k * b.duration) + k * b.duration
    return r


def _memory_waits(memory: Memory, anc: Mapping[str, frozenset[str]]) -> dict[str, list[tuple[Number, list[tuple[str, Number]]]]]:
    """Per allocating block, per device: the limit and the (releasing block, amount) of every
    hold a micro-batch has taken once it starts that block."""
    out: dict[str, list[tuple[Number, list[tuple[str, Number]]]]] = {}
    for limit, holds in memory.values():
        for a in sorted({a for a, _, _ in holds}):
            mine = [(rel, x) for a2, rel, x in holds if (a2 == a or a2 in anc[a]) and x > 0]
            if mine:
                out.setdefault(a, []).append((limit, mine))
    return out


def _memory_wait(k: int, t: float, limit: Number,
                 holds: Sequence[tuple[list[float], Number, float | None, int]]) -> float:
    """The least time >= t at which the k-th task of an allocating block may start, by the memory
    argument of staggered_releases; holds: per release, the least ends of its tasks worked out
    so far (0 .. k, or 0 .. k-1 and then `extra`, the k-th one's least end: at least its value
    without memory and after the (k-1)-th one, as they run one after another), the amount and
    the most of the k+1 micro-batches that can have ended it.
    held() only falls at the releases' ends, so the least time is t itself or one of them.
    A release counted as ended a hair early (EPS_MEMORY) only lowers the bound."""
    def ended(e: list[float], extra: float | None, top: int, at: float) -> int:
        count = bisect_right(e, at + EPS_MEMORY, 0, min(len(e), k + 1)) + int(extra is not None and extra <= at + EPS_MEMORY)
        return min(count, top)

    def held(at: float) -> float:
        return sum(x * max(0, k + 1 - ended(e, extra, top, at)) for e, x, extra, top in holds)
    if held(t) <= limit + EPS_MEMORY:
        return t
    best = math.inf
    for e, _, extra, _ in holds:  # per release, the first of its ends (after t) at which enough is free
        def end(j: int, e: list[float] = e, extra: float | None = extra) -> float:
            return e[j] if extra is None or j < k else extra
        lo, hi = bisect_right(e, t, 0, k + 1 if extra is None else k), k
        if extra is not None and lo == k and extra <= t:
            lo = k + 1
        if lo > hi or held(end(hi)) > limit + EPS_MEMORY:
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if held(end(mid)) <= limit + EPS_MEMORY else (mid + 1, hi)
        best = min(best, end(lo))
    return t if best == math.inf else best


def _grouped(release: Vec, duration: Number, tail: Vec) -> list[tuple[Number, Number, Number]]:
    """A block's N tasks (k-th: release[k], tail[k]) as at most JOB_GROUPS jobs: the first and
    last ones alone (where releases and tails differ most), the middle ones in runs, each run
    one job with its least release, its summed durations and its least tail. A relaxation (the
    run's job may be cut where its tasks ran), so the one-machine bound stays a lower bound."""
    n = len(release)
    if n <= JOB_GROUPS:
        return [(float(release[k]), duration, float(tail[k])) for k in range(n)]
    edge = JOB_GROUPS // 4
    middle = n - 2 * edge
    runs = JOB_GROUPS - 2 * edge
    cuts = [0, *range(1, edge + 1), *(edge + (middle * i) // runs for i in range(1, runs)), *range(n - edge, n + 1)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        if b > a:  # releases rise and tails fall with k: the run's least are at its ends
            out.append((float(release[a]), (b - a) * duration, float(tail[b - 1])))
    return out


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


def device_lower_bound(p: Placement, micro_batches: int, memory: Memory | None = None,
                       term_work: int = DEVICE_TERM_WORK, ramp: bool = True) -> Number:
    """max over devices of the one-machine bound of its N x blocks tasks, each task with its own
    release and tail (staggered_releases / staggered_tails: the k-th task of a block to start
    is the (N-1-k)-th last to end, as a block's tasks on a device run one after another).
    `memory` maps a device to its limit and its holds: a task that allocates also waits for
    enough releases.

    It is at least lower_bound(): the set of all of a device's tasks gives head + N * load +
    tail, and one micro-batch's path through a device gives the critical path. Where latency
    matters it adds what head + N * load + tail misses: a block whose first task must wait for
    a round trip through other devices (the V's backward after its forward) splits the
    device's work, and the part after the wait cannot start before it; with a memory limit,
    a device can start only so many micro-batches before the releases of the first round trip
    come back. Above STAGGER_TASKS (task, device) pairs, a block's tasks share its head and tail."""
    return max(device_bounds(p, micro_batches, memory, term_work=term_work, ramp=ramp).values(), default=0)


def device_bounds(p: Placement, micro_batches: int, memory: Memory | None = None,
                  rows: tuple[Rows, Rows] | None = None, term_work: int = DEVICE_TERM_WORK,
                  ramp: bool = True) -> dict[int, Number]:
    """device_lower_bound's one-machine bound of each device with blocks, and with `memory` and
    `ramp` the memory ramp's (holds.device_ramp: at the start, the end, both) where higher;
    `rows`: the staggered releases and tails when already worked out."""
    n = micro_batches
    pairs = n * sum(len(b.devices) for b in p.blocks)
    ramps: dict[int, Number] = {}
    if pairs <= STAGGER_TASKS:
        r, q = rows or (staggered_releases(p, n, memory, term_work), staggered_tails(p, n, memory, term_work))
        jobs_of = {b.id: _grouped(r[b.id], b.duration, q[b.id][::-1]) for b in p.blocks}
        ramps = {d: device_ramp(p.blocks_on(d), r, q, limit, holds)
                 for d, (limit, holds) in (memory or {}).items() if ramp and p.blocks_on(d)}
    else:
        pt = paths(p)
        jobs_of = {b.id: [(pt.earliest[b.id], n * b.duration, pt.tail[b.id] - b.duration)] for b in p.blocks}
    return {d: max(one_machine_bound([j for b in p.blocks_on(d) for j in jobs_of[b.id]]), ramps.get(d, 0))
            for d in range(p.devices) if p.blocks_on(d)}
