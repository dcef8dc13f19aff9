"""Grouped repetends for looped placements (stage k on device k mod p, v >= 2 chunks a device).

The period search and fast.py's constructions give repetends of one or two micro-batches; on a
looped pipeline the schedules that hide the latency run micro-batches in groups of p: the group
goes through chunk 0 on every device, then through chunk 1, and so on, so the first micro-batch
of a group comes back to device 0 for its next chunk just as the p-th leaves it (its round trip
covered by the p - 1 others' work). That shape is a repetend of p copies, which CP-SAT does not
find at the bound within seconds (interleaved-zb, 4 devices, profiled costs, latency: the 2-copy
repetend completes to 34.7, the grouped one to 32.5, the peer's hand-made order 32.48).

Built from the placement, not copied: per device, the chunk rounds' forwards in group order and
the backwards in reverse chunk order, run 1F1B after a warm-up of forwards; a split backward's W
right after its B, or kept back behind the device's later B passes (the cool-down's bubbles:
ZB-H1's idea, held back by r on device r). Each variant is list scheduled over GROUPS groups and
the repetend read off its middle: p consecutive micro-batches repeated every shift of the
group, kept when no two tasks of a device overlap modulo the period and its steady state fits
the memory limits (fewer warm-up forwards hold less: under tighter limits the warm-ups are
capped, the largest cap that fits kept; the period grows as the cap falls). Linear walks, no
solver: GROUPS x p micro-batches (fewer groups where that is over MOST_TASKS: 5 at 16 devices),
a dozen list schedules at most.

On the search's own N micro-batches (a multiple of p), the same variants' list schedules are
schedules too (`grouped_lists`): where N is a few groups, warm-up and cool-down are most of it,
and the list schedule runs them better than a repetend's unroll compacted (16 devices).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..baselines.interleaved import interleaved_orders, looped
from ..baselines.shapes import BaselineError
from ..key import Key
from ..timing import DeadlockError, earliest_starts
from .completion import makespan
from .justify import no_overlap
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
GROUPS = 8  # groups of p micro-batches list scheduled: warm-up, cool-down and a steady middle ...
FEWEST = 3  # ... fewer on large placements (to fit MOST_TASKS), never under v + FEWEST
MOST = 4  # grouped repetends returned at most (the least period per micro-batch, then span, first)
MOST_TASKS = 8_000  # tasks (micro-batches x blocks) one list schedule may have: above it, fewer groups, then none
# (8 devices: 3,072 in 8 groups; 16 devices, 2 chunks, B/W split: 7,680 in 5 groups, 12,288 in 8, seconds more
# on a loaded machine for the same repetends)
CAPS = 8  # warm-up caps tried, from one short of Megatron's down (each three list schedules at most)
Warm = Callable[[int, int, int], int]
Lag = Callable[[int], int]


def grouped(problem: Problem, deadline: float = math.inf) -> list[Modulo]:
    """The grouped repetends of this looped placement that fit memory, best first; [] when the
    placement is not a looped pipeline (or too large to list schedule GROUPS groups). Besides the
    usual warm-ups, for tighter limits the largest cap on them (of CAPS tried) that fits. The
    variants tried by the time.perf_counter() `deadline` only (as fast.constructions: at 8
    devices a dozen list schedules take a loaded machine's second or two), Megatron's first."""
    try:
        chain, v = looped(problem.units)
    except BaselineError:
        return []
    p = problem.units.devices
    n = p * groups(p, v, len(problem.block_ids))
    if n * len(problem.block_ids) > MOST_TASKS:
        return []
    lags = _lags(p, bool(chain.weight))
    found = _read(problem, n, [(_warm(extra), lag) for extra in (2, 1, 0) for lag in lags], deadline)
    for cap in _caps(p, v):
        capped = _read(problem, n, [(_warm(1, cap), lag) for lag in lags], deadline)
        found += capped
        if capped:
            break
    unique = {tuple(sorted(m.starts().items())): m for m in found}
    ranked = sorted(unique.values(), key=lambda m: (m.per_micro_batch, m.span(problem)))
    log.info("grouped repetends: %d (periods %s)", len(ranked), [m.period for m in ranked])
    return ranked[:MOST]


def grouped_lists(problem: Problem, n: int, deadline: float = math.inf) -> list[dict[Key, int]]:
    """The same variants' own list schedules of the search's `n` micro-batches (a multiple of
    p) within the memory limits, shortest first; the capped warm-ups only when no other fits.
    On few micro-batches a group's warm-up and cool-down are most of the schedule: the list
    schedule runs them as the steady state allows, a grouped repetend's unroll compacted does
    not (interleaved-zb, 16 devices, profiled costs, 32 micro-batches, 32 activations a
    device: 90.40 against 102.22). [] when not looped, n is not a multiple of p or too large."""
    try:
        chain, v = looped(problem.units)
    except BaselineError:
        return []
    p = problem.units.devices
    if n % p or n * len(problem.block_ids) > MOST_TASKS:
        return []
    lags = _lags(p, bool(chain.weight))
    tiers = [[(_warm(extra), lag) for extra in (2, 1, 0) for lag in lags]]
    tiers += [[(_warm(1, cap), lag) for lag in lags] for cap in _caps(p, v)]
    for tier in tiers:
        found = [st for warm, lag in tier if time.perf_counter() <= deadline
                 for st in [_listed(problem, n, warm, lag)] if st is not None]
        if found:
            return sorted(found, key=lambda st: makespan(problem, st))
    return []


def _listed(problem: Problem, n: int, warm: Warm, lag: Lag) -> dict[Key, int] | None:
    """The variant's list schedule of `n` micro-batches on the grid, None when it deadlocks or
    its peak is over a limit (the list schedule does not wait for memory)."""
    try:
        starts = earliest_starts(problem.units, n, interleaved_orders(problem.units, n, warm, lag))
    except DeadlockError:
        return None
    grid = {k: int(t) for k, t in starts.items()}
    if problem.limit is not None:
        peak = problem.grid_schedule(n, grid, check=False).peak_memory
        if any(x > lim for x, lim in zip(peak, problem.limit)):
            return None
    return grid


def _lags(p: int, split: bool) -> list[Lag]:
    """The W passes of a split backward held back by 0, by r or by p - 1 - r on device r."""
    return [lambda r: 0] + ([lambda r: r, lambda r: p - 1 - r] if split else [])


def _caps(p: int, v: int) -> range:
    """The warm-up caps tried, from one short of Megatron's down."""
    return range((v - 1) * p + p - 2, 0, -1)[:CAPS]


def groups(devices: int, chunks: int, blocks: int) -> int:
    """Groups list scheduled: GROUPS, fewer when that many are over MOST_TASKS, never under
    chunks + FEWEST (the warm-up's chunk rounds, a steady middle, the cool-down). At 16
    devices (interleaved-zb, profiled or unit costs, latency or not, 32 or 47 activations a
    device) 5 groups give the same periods as 8, in half the time."""
    fit = MOST_TASKS // (devices * blocks)
    return max(chunks + FEWEST, min(GROUPS, fit))


def _read(problem: Problem, n: int, variants: Sequence[tuple[Warm, Lag]], deadline: float) -> list[Modulo]:
    """The repetends read off each variant's list schedule of `n` micro-batches (those begun by `deadline`)."""
    found = []
    units = problem.units
    for warm, lag in variants:
        if time.perf_counter() > deadline:
            break
        try:
            starts = {k: int(t) for k, t in earliest_starts(units, n, interleaved_orders(units, n, warm, lag)).items()}
        except DeadlockError:
            continue
        mod = _window(problem, n, units.devices, starts)
        if mod is not None:
            found.append(mod)
    return found


def _warm(extra: int, cap: int | None = None) -> Warm:
    """Device r's warm-up: the first v - 1 chunk rounds of a group, and `extra` forwards per
    device after it (Megatron's 2, ZB-H1's 1), at most `cap` (the activations a device holds
    grow with its warm-up)."""
    if cap is None:
        return lambda r, p, v: max(1, (v - 1) * p + extra * (p - r - 1))
    return lambda r, p, v: max(1, min((v - 1) * p + extra * (p - r - 1), cap))


def _window(problem: Problem, n: int, copies: int, starts: dict[Key, int]) -> Modulo | None:
    """Of the windows in the middle half of the schedule, `copies` micro-batches repeated every
    `copies` load bounds or every shift of the next group, the valid repetend that fits memory
    with the least period (then span), the first at the load bound. Not the first one that is
    valid: a list schedule settles slowly (interleaved-zb, 6 devices, latency: its groups start
    18, 42, then 36 apart, the load bound). The device rule is screened on arrays first (at 16
    devices a window holds 1,536 tasks, a few hundred candidates a search)."""
    blocks, dur = problem.block_ids, problem.duration
    grid = np.array([[starts[(b, k)] for k in range(n)] for b in blocks], dtype=np.int64)
    lengths = np.array([dur[b] for b in blocks], dtype=np.int64)
    rows = _device_rows(problem)
    best: tuple[int, int, Modulo] | None = None  # period, span, repetend
    for k in range(n // 4, 3 * n // 4 - copies):
        window = grid[:, k:k + copies]
        span = int((window + lengths[:, None]).max() - window.min())
        for period in sorted({copies * problem.period_bound, int(grid[0, k + copies] - grid[0, k])}):
            if period < copies * problem.period_bound or (best is not None and (period, span) >= best[:2]):
                continue
            if not all(_apart(window[r], lengths[r], period) for r in rows):
                continue
            mod = Modulo.from_starts(period, {(b, j): int(window[i, j]) for i, b in enumerate(blocks)
                                              for j in range(copies)}, copies)
            if no_overlap(problem, mod) and fits(problem, mod):
                best = period, span, mod
        if best is not None and best[0] == copies * problem.period_bound:
            break  # at the load bound: the windows after it are the same steady state
    return None if best is None else best[2]


def _device_rows(problem: Problem) -> list[np.ndarray]:
    """Per device, the indices (in problem.block_ids) of the blocks it runs."""
    on: dict[int, list[int]] = {}
    for i, b in enumerate(problem.block_ids):
        for d in problem.devices_of[b]:
            on.setdefault(d, []).append(i)
    return [np.array(ix, dtype=np.int64) for ix in on.values()]


def _apart(window: np.ndarray, lengths: np.ndarray, period: int) -> bool:
    """One device's tasks (rows: blocks, columns: copies) run apart modulo `period`: each ends
    by the next one's phase, the last by the first's a period later (justify.no_overlap's test)."""
    phase = (window % period).ravel()
    length = np.repeat(lengths, window.shape[1])
    order = np.lexsort((length, phase))
    phase, length = phase[order], length[order]
    gaps = np.diff(np.append(phase, phase[0] + period))
    return bool((gaps >= length).all())
