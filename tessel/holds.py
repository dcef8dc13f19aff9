"""How long a micro-batch holds memory on a device: the least time from the start of an
allocating block to the end of its releasing one (Little's law in bounds.memory_lower_bound and
Problem.memory_period_bound), exact while longest paths are cheap, a path below it above that;
and how much of a device's work the memory lets start before a time, or end after one (ramp_bound,
two_ended_ramp: device_ramp, in bounds.device_bounds)."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .placement import Block, Number, Placement


def hold_time(p: Placement, first: str, last: str) -> Number:
    """Least time from the start of `first` to the end of `last` (a descendant): the longest path."""
    dist: dict[str, Number] = {first: 0}
    for x in p.topo_order:
        if x in dist:
            for y in p.succs[x]:
                dist[y] = max(dist.get(y, 0), dist[x] + p.by_id[x].duration + p.edge_latency(x, y))
    return dist[last] + p.by_id[last].duration


HOLD_WORK = 5_000_000  # memory pairs x blocks up to which each pair's hold is its longest path (quadratic above)


def holds_of(p: Placement, pairs: int) -> Callable[[str, str], Number]:
    """hold_time while `pairs` longest paths are cheap, else chain_hold(p): a lower bound of it in O(1)."""
    return _longest_holds(p) if pairs * len(p.blocks) <= HOLD_WORK else chain_hold(p)


def _longest_holds(p: Placement) -> Callable[[str, str], Number]:
    """hold_time, its lookups done once for all pairs, the same sums in the same order (1,024 devices: 2x)."""
    order = p.topo_order
    at = {x: i for i, x in enumerate(order)}
    duration = {x: p.by_id[x].duration for x in order}
    out = {x: [(y, p.edge_latency(x, y)) for y in p.succs[x]] for x in order}

    def hold(first: str, last: str) -> Number:
        dist: dict[str, Number] = {first: 0}
        for x in order[at[first]:at[last]]:  # only these can lie on a path from first to last
            if (d := dist.get(x)) is not None:
                d += duration[x]
                for y, lat in out[x]:
                    dist[y] = max(dist.get(y, 0), d + lat)
        return dist[last] + duration[last]
    return hold


def chain_hold(p: Placement) -> Callable[[str, str], Number]:
    """A least time from the start of a to the end of r (its descendant) in O(1) after one pass:
    the length of one path from a to r, a lower bound of the longest (hold_time), along
    consecutive blocks of the topological order where each is an edge; else a's least gap to a
    successor and r's duration. For thousands of devices, where a longest path per memory pair
    is quadratic."""
    order = p.topo_order
    at = {b: i for i, b in enumerate(order)}
    run, prefix = [0], [0.0]

    def gap(x: str, y: str) -> Number:
        return p.by_id[x].duration + p.edge_latency(x, y)

    for k in range(1, len(order)):
        x, y = order[k - 1], order[k]
        linked = y in p.succs[x]
        run.append(run[-1] if linked else k)
        prefix.append(prefix[-1] + gap(x, y) if linked else 0.0)

    def hold(a: str, r: str) -> Number:
        i, j = at[a], at[r]
        path = prefix[j] - prefix[i] if run[j] <= i else min(gap(a, y) for y in p.succs[a])
        return path + p.by_id[r].duration
    return hold


# ---- the memory ramp: how much of a device's work fits before a time ---------------------------
Hold = tuple[str, str, Number]  # (allocating block, releasing block, amount) of one micro-batch
Vec = np.ndarray[Any, np.dtype[np.float64]]


def ramp_bound(on: Sequence[Block], rows: Mapping[str, Sequence[float] | Vec], limit: Number,
               holds: Sequence[Hold]) -> float:
    """A least makespan of one device by the work that fits before a time R: every schedule does
    the device's whole work W, and before R at most what (a) the tasks whose least start (`rows`:
    per block, its k-th task's in time order, rising with k) is below R can do, started as soon
    as they may (no schedule does more by R), and (b) of the tasks that allocate, no more than
    the memory lets start: their amounts, summed, fit in `limit` plus what the releases whose
    least end is by R can have given back (rule 4 just before the last such start; a fractional
    knapsack over the allocating blocks, above any real choice). So the makespan is at least
    R + W - (that work), for every R (each distinct least start). Where the first backward of a
    V comes back late (latency) and the memory caps the forwards, the device idles before it
    whatever the order, which the preemptive one-machine bound (any released forward may fill
    the wait there) does not see. Read backwards in time (tails for releases, each hold's
    release for its allocation) the same argument bounds the idle at the end."""
    at, cap, total = ramp_profile(on, rows, limit, holds)
    return float(np.max(at + total - cap)) if len(at) else 0.0


def ramp_profile(on: Sequence[Block], rows: Mapping[str, Sequence[float] | Vec], limit: Number,
                 holds: Sequence[Hold]) -> tuple[Vec, Vec, float]:
    """ramp_bound's times R (each distinct least start, rising; none fits before the first), the
    most work of the device that fits before each (rising with R), and the device's whole work W."""
    alloc: dict[str, float] = {}
    free: dict[str, float] = {}
    for a, r, x in holds:
        alloc[a] = alloc.get(a, 0.0) + float(x)
        free[r] = free.get(r, 0.0) + float(x)
    ids = [b.id for b in on]
    dur = {b.id: float(b.duration) for b in on}
    rel = np.concatenate([np.asarray(rows[b], dtype=np.float64) for b in ids])
    order = np.argsort(rel, kind="stable")
    rel = rel[order]
    d = np.concatenate([np.full(len(rows[b]), dur[b]) for b in ids])[order]
    plain = np.concatenate([np.full(len(rows[b]), b not in alloc) for b in ids])[order]
    last = np.flatnonzero(rel[1:] > rel[:-1])  # a prefix ends there; the next least start is R
    at = rel[last + 1]
    done = _asap(rel, d, at, last)
    fits = _asap(np.where(plain, rel, -np.inf), np.where(plain, d, 0.0), at, last)
    budget = np.full(len(at), float(limit))
    dusty = at + _dust(float(d.sum()))  # a release ending at R in reals may sum an ulp past it
    for r, x in free.items():
        if r in dur:
            budget += x * np.searchsorted(np.asarray(rows[r], dtype=np.float64) + dur[r], dusty, side="right")
    for a in sorted((a for a in alloc if a in dur), key=lambda a: (-dur[a] / alloc[a] if alloc[a] > 0 else -math.inf, a)):
        count = np.searchsorted(np.asarray(rows[a], dtype=np.float64), at, side="left").astype(np.float64)
        take = count if alloc[a] <= 0 else np.minimum(count, np.maximum(budget, 0.0) / alloc[a])
        fits += take * dur[a]
        budget -= take * max(alloc[a], 0.0)
    # before the first least start no work fits; the work before R is within the work before any
    # later R, so each cap is at most every later one (a running minimum from the end: rising)
    cap = np.minimum.accumulate(np.concatenate([[0.0], np.minimum(done, fits)])[::-1])[::-1]
    return np.concatenate([rel[:1], at]), cap, float(d.sum())


def _dust(work: float) -> float:
    """What float sums of a device's work may be off by: the ramp's comparisons give it away."""
    return 1e-9 * max(1.0, work)


def two_ended_ramp(start: tuple[Vec, Vec, float], end: tuple[Vec, Vec, float]) -> float:
    """A least makespan M from the idle at both ends at once: `start` is ramp_profile's (R, the
    most work before R, W) read forwards, `end` the same read backwards (R': the most work in
    the last R' before M). Where W exceeds both caps together the two windows [0, R] and
    [M - R', M] cannot overlap (together they would hold all the work), so the work between
    them, at least W - cap(R) - cap'(R'), runs in M - R - R': M >= R + R' + W - cap - cap'.
    ramp_bound takes one end at a time; this adds the other end's idle to it (a V's tip idles
    before its first backward comes back and after its last forward leaves)."""
    (at, cap, total), (at2, cap2, _) = start, end
    if not len(at) or not len(at2):
        return 0.0
    # per R, the best R' among those whose cap' < W - cap(R): cap' rises with R', so a prefix.
    # Strictly less by more than float dust: where the caps together hold exactly W (a serial
    # device, one micro-batch in flight), the windows may overlap and the argument gives nothing
    gain = np.maximum.accumulate(at2 - cap2)
    fit = np.searchsorted(cap2, total - cap - _dust(total), side="left")  # first index with cap' >= W - cap
    ok = fit > 0
    if not ok.any():
        return 0.0
    return float(np.max((at + total - cap)[ok] + gain[fit[ok] - 1]))


def device_ramp(on: Sequence[Block], releases: Mapping[str, Sequence[float] | Vec],
                tails: Mapping[str, Sequence[float] | Vec], limit: Number, holds: Sequence[Hold]) -> float:
    """The memory ramp's bound of one device: the idle at the start (ramp_bound on the least
    starts `releases`), at the end (on the least tails `tails`, each hold's release for its
    allocation), and at both at once (two_ended_ramp)."""
    start = ramp_profile(on, releases, limit, holds)
    end = ramp_profile(on, tails, limit, [(r, a, x) for a, r, x in holds])
    ends = [float(np.max(at + total - cap)) for at, cap, total in (start, end) if len(at)]
    return max([*ends, two_ended_ramp(start, end)])


def _asap(rel: Vec, d: Vec, at: Vec, last: np.ndarray[Any, np.dtype[np.intp]]) -> Vec:
    """Per prefix of the tasks (least starts `rel`, sorted; durations `d`) ending at `last`, the
    work done by `at` when each starts as soon as it may in that order: a task's end is
    max over j <= i of rel[j] + d[j] + ... + d[i] (a zero duration adds nothing)."""
    s = np.cumsum(d)
    end = s + np.maximum.accumulate(np.where(d > 0, rel - (s - d), -np.inf))
    end = np.where(np.isfinite(end), end, 0.0)
    out: Vec = s[last] - np.maximum(0.0, end[last] - at)
    return out


# ---- the work a device spends giving memory back -------------------------------------------------
SUBSETS = 8  # most releasing blocks of one allocation whose subsets are all weighed (2**8 sums)


@dataclass(frozen=True)
class Floor:
    """What the k-th task of an allocating block waits for on one limited device (release_floors)."""
    amount: float  # held per micro-batch once it starts the block (its holds and its ancestors')
    limit: float
    start: float  # the least start of any task on the device that leads to a release
    cost: float  # the least work there per unit given back
    alloc_cost: float  # the least work per unit allocated, of the block and its allocating ancestors there
    own: float  # what the block itself allocates

    def wait(self, k: int) -> float:
        """The least start of the k-th task (0 where nothing need come back)."""
        freed = (k + 1) * self.amount - self.limit
        return self.start + freed * self.cost + max(0.0, freed - self.own) * self.alloc_cost if freed > 0 else 0.0


def release_floors(p: Placement, memory: Mapping[int, tuple[Number, Sequence[Hold]]],
                   near: Mapping[str, frozenset[str]], first: Mapping[str, float]) -> dict[str, list[Floor]]:
    """Per allocating block a, per limited device d: what the k-th task of a waits for on d
    besides the releases' own least ends (bounds.staggered_releases' memory argument). The k+1
    micro-batches that started a hold `amount` each (a's holds and its ancestors'), so when the
    k-th starts, at time t, F = (k + 1) * amount - limit of it has been given back on d: by
    releasing tasks there that ended, each after its micro-batch's tasks there that lead to it
    (its ancestors on d but the allocating ones). Those tasks, disjoint between micro-batches,
    run after the least start of the first of them (`first`: per block, its least start), for
    at least F times the least work per unit given back (the least over the sets of releasing
    blocks one micro-batch may end). And at most `limit` was allocated before the first
    release ended, so of the k+1 micro-batches' allocations all but `limit` and the k-th's own
    start after it too: F - own more units, each at least the least work per unit allocated.
    One device runs them all before t. Where the memory comes back only after a round trip, the
    device's own backward work spaces the later forwards out (a V's tip: each chunk freed costs a
    backward and a weight gradient there, and the forward that takes it waits for both)."""
    out: dict[str, list[Floor]] = {}
    for d, (limit, holds) in sorted(memory.items()):
        allocating = {a for a, _, _ in holds}
        here = {b.id for b in p.blocks_on(d)}
        for a in sorted(allocating):
            mine: dict[str, float] = {}
            taken: dict[str, float] = {}
            for a2, rel, x in holds:
                if (a2 == a or a2 in near[a]) and x > 0:
                    mine[rel] = mine.get(rel, 0.0) + float(x)
                    taken[a2] = taken.get(a2, 0.0) + float(x)
            lead = {r: ({r, *near[r]} & here) - allocating for r in mine}
            cost = _least_cost(p, mine, lead)
            if mine and cost > 0:
                start = min(first[b] for r in mine for b in lead[r])
                per = min(p.by_id[b].duration / x if b in here else 0.0 for b, x in taken.items())
                out.setdefault(a, []).append(Floor(sum(mine.values()), float(limit), start, cost, per,
                                                   taken.get(a, 0.0)))
    return out


def _least_cost(p: Placement, freed: Mapping[str, float], lead: Mapping[str, set[str]]) -> float:
    """The least work on the device per unit of memory one micro-batch gives back by ending a
    set of releasing blocks (`freed`: each one's amount; `lead`: the tasks on the device each
    needs, itself included); over every set while few, else per block alone with its own
    duration only (a set's work is at least the sum of its releases' own: still a lower bound)."""
    names = sorted(freed)
    if len(names) > SUBSETS:
        return min(p.by_id[r].duration / freed[r] if r in lead[r] else 0.0 for r in names)
    best = math.inf
    for mask in range(1, 1 << len(names)):
        chosen = [r for i, r in enumerate(names) if mask >> i & 1]
        work = sum(p.by_id[b].duration for b in set().union(*(lead[r] for r in chosen)))
        best = min(best, work / sum(freed[r] for r in chosen))
    return best


# ---- the memory cycle: what the device runs before memory comes back ----------------------------
CYCLE_WINDOW = 8  # tasks of each block before the k-th that the memory cycle counts (its cost: linear in it)
CYCLE_CALLS = 4_100  # most micro-batches x (allocating block, device) pairs for memory cycles (~0.1 ms each)
CYCLE_MICRO_BATCHES = 64  # most micro-batches for memory cycles
CYCLE_FLIGHT = 9  # most micro-batches a device's memory holds at once for its memory cycles (tight memory only)


@dataclass(frozen=True)
class Cycle:
    """What the k-th task of an allocating block x waits for on one limited device (memory_cycles):
    the releases there, each (block, amount per micro-batch, a descendant of x); the blocks on the
    device that count (`names`); per block, how many of its tasks count whatever the releases (k + 1
    for x's ancestors there, k for x itself: `base`); per release, the blocks it waits for there
    (itself and its ancestors on the device: `leads`)."""
    limit: float
    releases: tuple[tuple[str, float, bool], ...]
    names: tuple[str, ...]
    base: tuple[int, ...]  # 1: an ancestor of x (k + 1 tasks), 0: x itself (k), -1: neither
    leads: tuple[tuple[bool, ...], ...]

    def wait(self, k: int, rows: Callable[[str, int, int], Sequence[float]], duration: Mapping[str, Number]) -> float:
        """The least start of the k-th task of x by the memory cycle (memory_cycles); 0 where the
        memory does not hold it back. `rows(b, lo, hi)`: the least starts of tasks lo .. hi - 1 of b
        in time order. Of each block only the last CYCLE_WINDOW tasks counted are kept (fewer jobs:
        a lower bound still)."""
        amounts = [a for _, a, _ in self.releases]
        need = (k + 1) * sum(amounts) - self.limit
        splits = _splits(need, amounts, [k if after else k + 1 for _, _, after in self.releases]) if need > 1e-9 else []
        if not splits:
            return 0.0
        base = np.array(self.base)
        counts = np.tile(np.where(base < 0, 0, k + base), (len(splits), 1))
        ended = np.array(splits)
        for i, lead in enumerate(self.leads):
            counts = np.maximum(counts, np.where(np.array(lead), ended[:, i:i + 1], 0))
        lo = max(0, k - CYCLE_WINDOW)
        j = np.arange(lo, k + 1)
        rel = np.array([rows(b, lo, k + 1) for b in self.names]).ravel()
        work = np.repeat([float(duration[b]) for b in self.names], len(j))
        order = np.argsort(rel, kind="stable")
        mask = (j[None, None, :] < counts[:, :, None]).reshape(len(splits), -1)[:, order]
        after = np.cumsum((mask * work[order])[:, ::-1], axis=1)[:, ::-1]
        ends = np.where(mask, rel[order][None, :] + after, -np.inf).max(axis=1)
        return max(0.0, float(ends.min()))


def one_machine_end(release: Sequence[float], work: Sequence[float]) -> float:
    """The least time one machine ends every job (release, work): max over jobs of its release
    plus the work of every job released no earlier (those run after it starts, whatever the order)."""
    rel = np.asarray(release)
    order = np.argsort(rel, kind="stable")
    after = np.cumsum(np.asarray(work)[order][::-1])[::-1]
    return float(np.max(rel[order] + after))


def _splits(need: float, amounts: Sequence[float], tops: Sequence[int]) -> list[tuple[int, ...]]:
    """The least counts of each release's ended tasks (each at most its top) that give back at
    least `need`: with two releases, every least pair (any other split is above one of them);
    with more, the one below all of them (each count the least it can be whatever the others)."""
    def least(rest: float, a: float) -> int:
        return max(0, math.ceil(rest / a - 1e-9)) if a > 0 else 0
    if sum(a * t for a, t in zip(amounts, tops)) < need - 1e-9:
        return []  # nothing gives enough back: the memory argument of the bounds says so
    if len(amounts) != 2:
        total = sum(a * t for a, t in zip(amounts, tops))
        return [tuple(min(t, least(need - (total - a * t), a)) for a, t in zip(amounts, tops))]
    (a1, a2), (t1, t2) = amounts, tops
    return [(e1, e2) for e1 in range(t1 + 1) if (e2 := least(need - a1 * e1, a2)) <= t2]


def memory_cycles(p: Placement, memory: Mapping[int, tuple[Number, Sequence[Hold]]],
                  near: Mapping[str, frozenset[str]], n: int) -> dict[str, list[Cycle]]:
    """Per allocating block x, per limited device d: the memory cycle of the k-th task of x. When
    it starts, the k+1 micro-batches that started x hold every amount of x's holds and its
    ancestors' until their release ends, so the releases have given back at least
    (k + 1) * amount - limit by then: some counts of each releasing block's tasks ended (the first
    ones in time order, as a block's tasks run one after another; a release that comes after x
    has ended for at most k of them). Each ended release ran on d after its micro-batch's
    ancestors there; and before the k-th task of x, d ran k tasks of x and k+1 of each of its
    ancestors there (bounds.staggered_releases' device term). All on one machine, each no
    earlier than its least start: the k-th task starts no earlier than the least time d ends
    them, over every split of the releases that gives enough back. Where the memory comes back
    only after a round trip, it adds what the device runs in the round trip's cycle (a V's tip:
    a backward, both weight gradients and the next forward, one after another) to what the
    releases' least ends alone prove. Only on devices whose memory holds at most CYCLE_FLIGHT
    micro-batches at once (where a round trip's cycle sets the pace; elsewhere it costs time and
    seldom proves more), none above CYCLE_CALLS or CYCLE_MICRO_BATCHES (`n` micro-batches)."""
    out: dict[str, list[Cycle]] = {}
    if n > CYCLE_MICRO_BATCHES or n * sum(len({a for a, _, _ in holds}) for _, holds in memory.values()) > CYCLE_CALLS:
        return out
    for d, (limit, holds) in sorted(memory.items()):
        here = {b.id for b in p.blocks_on(d)}
        if float(limit) > CYCLE_FLIGHT * sum(float(x) for _, _, x in holds if x > 0):
            continue
        for x in sorted({a for a, _, _ in holds}):
            freed: dict[str, float] = {}
            for a2, rel, amount in holds:
                if (a2 == x or a2 in near[x]) and amount > 0:
                    freed[rel] = freed.get(rel, 0.0) + float(amount)
            if freed and x in here:
                ends = sorted(freed)
                leads = [({r} | near[r]) & here for r in ends]
                names = tuple(sorted((near[x] & here) | {x}.union(*leads)))
                out.setdefault(x, []).append(Cycle(
                    float(limit), tuple((r, freed[r], x in near[r]) for r in ends), names,
                    tuple(1 if b in near[x] else 0 if b == x else -1 for b in names),
                    tuple(tuple(b in lead for b in names) for lead in leads)))
    return out
