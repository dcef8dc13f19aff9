"""Completion: warm-up and cool-down around the repetend for N micro-batches.

The plain unroll (micro-batch k at offset + k periods) is valid for every N: memory in warm-up
and cool-down stays below the steady state's. Two moves then shorten it, each keeping it valid:

- compaction: replay every device's task order as early as inputs allow (tessel.timing). It
  never lengthens a schedule, and memory is unchanged because each device sees its memory
  events in the same order.
- a bounded CP-SAT solve per end: free the first (last) K micro-batches, keep every other task
  where it is, and push the free ones as late (early) as devices, dependencies and memory allow
  (memory per device as a cumulative of holds, allocation to release, or a reservoir of events;
  free tasks stay inside the time range they had, so the rest of the schedule, and its memory
  after that range, is untouched).
"""
from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import bounds
from ..key import Key
from ..timing import earliest_starts, orders_from_starts
from .budget import Clock, Stall
from .modulo import Modulo
from .problem import Problem
from .solver import Expr, Model, SolveResult, work_done

log = logging.getLogger(__name__)
Starts = Mapping[Key, int]
MIN_WORK = 0.005  # deterministic seconds: a solve given less decides nothing


@dataclass(frozen=True)
class Completed:
    starts: dict[Key, int]
    statuses: tuple[str, ...]  # of every end solve, in order
    seconds: float
    work: float = 0.0  # deterministic seconds of solver work its solves did


def plain_unroll(mod: Modulo, micro_batches: int) -> dict[Key, int]:
    return mod.unrolled(range(micro_batches))


def makespan(problem: Problem, starts: Starts) -> int:
    return max(s + problem.duration[b] for (b, _), s in starts.items()) - min(starts.values())


def compact(problem: Problem, micro_batches: int, starts: Starts) -> dict[Key, int]:
    """Every device's order replayed as early as possible (never longer, same memory)."""
    out = earliest_starts(problem.units, micro_batches, orders_from_starts(problem.units, starts))
    return {key: int(v) for key, v in out.items()}


def complete(problem: Problem, starts: Starts, micro_batches: int, free: Sequence[int], clock: Clock,
             workers: int | None, stall: Stall, lower_bound: int = 0, cap: float | None = None,
             work: float = math.inf) -> Completed:
    """Warm-up and cool-down solves with compaction, freeing each count of micro-batches in
    `free` in turn (small first: cheap, and usually most of the gain), until the lower bound.
    Each solve stops on its `stall`, and after `cap` seconds at most (never the whole clock);
    all of them together do at most `work` deterministic seconds (one worker: the same on a
    loaded machine, so only the clock's end can make two runs differ)."""
    t0, w0, n = time.perf_counter(), work_done(), micro_batches
    best = compact(problem, n, starts)
    statuses: list[str] = []
    for k in free:
        for side, mbs in (("warmup", range(k)), ("cooldown", range(n - k, n))):
            left = work - (work_done() - w0)
            if clock.expired() or makespan(problem, best) <= lower_bound or left <= MIN_WORK:
                break
            solve = _warmup if side == "warmup" else _cooldown
            new, res = solve(problem, best, set(mbs), clock if cap is None else clock.within(cap), workers,
                             stall.within(left))
            statuses.append(res.status)
            new = compact(problem, n, new)
            if makespan(problem, new) <= makespan(problem, best):
                best = new
    return Completed(best, tuple(statuses), time.perf_counter() - t0, work_done() - w0)


def add_tasks(m: Model, problem: Problem, free: Mapping[Key, tuple[int, int]], fixed: Starts,
              base: Starts | None = None) -> None:
    """Free tasks as variables with start in [lo, hi], fixed ones as constants; devices,
    dependencies of free tasks, and memory on every limited device. `base` holds the start of
    every other task: the memory events of a micro-batch the model touches are all counted."""
    for (b, k), (lo, hi) in free.items():
        m.occupy(m.int_var((b, k), lo, hi), problem.duration[b], problem.devices_of[b], f"task_{b}_{k}")
    for (b, k), s in fixed.items():
        m.occupy(s, problem.duration[b], problem.devices_of[b], f"fixed_{b}_{k}")
    free_of: dict[str, list[int]] = defaultdict(list)  # block -> its free micro-batches (O(E N), not O(E T))
    for x, k in free:
        free_of[x].append(k)
    for a, b in problem.units.edges:
        for k in free_of[b]:
            if (a, k) in free:
                m.precede(m.vars[(a, k)], m.vars[(b, k)], problem.gap(a, b))
            else:
                m.precede(fixed[(a, k)], m.vars[(b, k)], problem.gap(a, b))
        for k in free_of[a]:
            if (b, k) not in free:
                m.precede(m.vars[(a, k)], fixed[(b, k)], problem.gap(a, b))
    start = {**(base or {}), **fixed, **{key: m.vars[key] for key in free}}
    touched = {k for _, k in list(free) + list(fixed)}
    low = min([lo for lo, _ in free.values()] + list(fixed.values()))
    for d in problem.limited_devices():
        _memory(m, problem, d, start, touched, (low - 1, _completed(problem, d, base or {}, touched, low)))


def _completed(problem: Problem, d: int, base: Starts, touched: set[int], low: int) -> int:
    """Memory left on device d by untouched micro-batches that ended before the model's range
    (0 when the placement's memory balances)."""
    ends: dict[int, int] = {}
    for (b, k), s in base.items():
        if k not in touched:
            ends[k] = max(ends.get(k, s), s + problem.duration[b])
    done = sum(1 for e in ends.values() if e <= low)
    return done * sum(problem.memory[b] for b in problem.memory_blocks(d))


def _memory(m: Model, problem: Problem, d: int, start: Mapping[Key, Expr], touched: set[int],
            offset: tuple[int, int]) -> None:
    """Memory of device d: holds from allocation to release (a cumulative, which propagates
    well) when the placement pairs them, else a reservoir of events."""
    pairs = problem.memory_pairs(d)
    if pairs is not None:
        spans = [(start[(a, k)], start[(r, k)] + problem.duration[r], amount)
                 for a, r, amount in pairs for k in touched]
        m.holds(spans, problem.cap(d))
        return
    times, deltas = [], []
    for b in problem.memory_blocks(d):
        mem = problem.memory[b]
        for k in touched:
            times.append(start[(b, k)] if mem > 0 else start[(b, k)] + problem.duration[b])
            deltas.append(mem)
    if offset[1]:  # (time, amount): before everything the model holds
        times.append(offset[0])
        deltas.append(offset[1])
    m.reservoir(times, deltas, problem.cap(d))


def _warmup(problem: Problem, starts: Starts, mbs: set[int], clock: Clock, workers: int | None,
            stall: Stall) -> tuple[dict[Key, int], SolveResult]:
    """Free micro-batches fill the gaps before the rest, starting as late as possible."""
    t0 = min(starts.values())
    free_keys = [key for key in starts if key[1] in mbs]
    end = max(starts[key] + problem.duration[key[0]] for key in free_keys)
    free = {key: (t0, end - problem.duration[key[0]]) for key in free_keys}
    fixed = {key: s for key, s in starts.items() if key[1] not in mbs and s < end}
    m = Model()
    add_tasks(m, problem, free, fixed, starts)
    first_fixed = min(fixed.values(), default=end)
    first = m.earliest("first", t0, min(end, first_fixed), (m.vars[key] for key in free))
    m.hints({key: starts[key] for key in free})
    bound = _latest_first(problem, fixed, free_keys, end)
    m.minimize(first_fixed - first, lower=max(0, first_fixed - bound))
    res = m.solve(clock, workers, phase="warmup", stall=stall)
    return _merged(starts, free, res), res


def _cooldown(problem: Problem, starts: Starts, mbs: set[int], clock: Clock, workers: int | None,
              stall: Stall) -> tuple[dict[Key, int], SolveResult]:
    """Free micro-batches fill the gaps after the rest, ending as early as possible."""
    free_keys = [key for key in starts if key[1] in mbs]
    begin = min(starts[key] for key in free_keys)
    end = max(s + problem.duration[b] for (b, _), s in starts.items())
    free = {key: (begin, end - problem.duration[key[0]]) for key in free_keys}
    fixed = {key: s for key, s in starts.items()
             if key[1] not in mbs and s + problem.duration[key[0]] > begin}
    m = Model()
    add_tasks(m, problem, free, fixed, starts)
    last_fixed = max((s + problem.duration[b] for (b, _), s in fixed.items()), default=begin)
    last = m.latest("last", max(begin, last_fixed), end, (m.vars[(b, k)] + problem.duration[b] for (b, k) in free))
    m.hints({key: starts[key] for key in free})
    bound = _earliest_last(problem, fixed, free_keys, begin)
    m.minimize(last - last_fixed, lower=max(0, bound - last_fixed))
    res = m.solve(clock, workers, phase="cooldown", stall=stall)
    return _merged(starts, free, res), res


def _merged(starts: Starts, free: Mapping[Key, tuple[int, int]], res: SolveResult) -> dict[Key, int]:
    out = dict(starts)
    if res.found:
        out.update({key: res.values[key] for key in free})
    return out


def _busy(problem: Problem, fixed: Starts, device: int) -> list[tuple[int, int]]:
    return sorted((s, s + problem.duration[b]) for (b, _), s in fixed.items() if device in problem.devices_of[b])


def _idle(busy: list[tuple[int, int]], x: int, y: int) -> int:
    """Time in [x, y) that no fixed task occupies."""
    return (y - x) - sum(max(0, min(e, y) - max(s, x)) for s, e in busy)


def _work(problem: Problem, free_keys: list[Key], device: int) -> int:
    return sum(problem.duration[b] for b, _ in free_keys if device in problem.devices_of[b])


def _latest_first(problem: Problem, fixed: Starts, free_keys: list[Key], end: int) -> int:
    """Upper bound on the warm-up's first start: every device fits its free work between
    first + head and end - tail, in the time the fixed tasks leave idle."""
    pt, best = bounds.paths(problem.units), end
    for d in range(problem.units.devices):
        need = _work(problem, free_keys, d)
        if not need:
            continue
        head, tail = (int(x) for x in bounds.device_head_tail(problem.units, d, pt))
        busy, stop = _busy(problem, fixed, d), end - tail
        lo, hi = stop - need - sum(e - s for s, e in busy), stop - need  # largest x with enough idle
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _idle(busy, mid, stop) >= need else (lo, mid - 1)
        best = min(best, lo - head)
    return best


def _earliest_last(problem: Problem, fixed: Starts, free_keys: list[Key], begin: int) -> int:
    """Lower bound on the cool-down's last end, by the same argument mirrored."""
    pt, best = bounds.paths(problem.units), begin
    for d in range(problem.units.devices):
        need = _work(problem, free_keys, d)
        if not need:
            continue
        head, tail = (int(x) for x in bounds.device_head_tail(problem.units, d, pt))
        busy, start = _busy(problem, fixed, d), begin + head
        lo, hi = start + need, start + need + sum(e - s for s, e in busy)  # smallest y with enough idle
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _idle(busy, start, mid) >= need else (mid + 1, hi)
        best = max(best, lo + tail)
    return best
