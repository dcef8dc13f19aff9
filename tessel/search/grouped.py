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
solver: GROUPS x p micro-batches, a dozen list schedules at most.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from ..baselines.interleaved import _interleaved_orders, _looped
from ..baselines.shapes import BaselineError
from ..key import Key
from ..timing import DeadlockError, earliest_starts
from .justify import _no_overlap
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
GROUPS = 8  # groups of p micro-batches list scheduled: warm-up, cool-down and a steady middle
MOST = 4  # grouped repetends returned at most (the least period per micro-batch, then span, first)
MOST_TASKS = 8_000  # tasks (micro-batches x blocks) one list schedule may have: above it, none (8 devices: 3,072;
# 16 devices: 12,288, a dozen list schedules of them seconds on a loaded machine, past a 5 s clock)
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
        chain, v = _looped(problem.units)
    except BaselineError:
        return []
    p = problem.units.devices
    n = p * max(GROUPS, v + 3)
    if n * len(problem.block_ids) > MOST_TASKS:
        return []
    lags: list[Lag] = [lambda r: 0] + ([lambda r: r, lambda r: p - 1 - r] if chain.weight else [])
    found = _read(problem, n, [(_warm(extra), lag) for extra in (2, 1, 0) for lag in lags], deadline)
    for cap in range((v - 1) * p + p - 2, 0, -1)[:CAPS]:
        capped = _read(problem, n, [(_warm(1, cap), lag) for lag in lags], deadline)
        found += capped
        if capped:
            break
    unique = {tuple(sorted(m.starts().items())): m for m in found}
    ranked = sorted(unique.values(), key=lambda m: (m.per_micro_batch, m.span(problem)))
    log.info("grouped repetends: %d (periods %s)", len(ranked), [m.period for m in ranked])
    return ranked[:MOST]


def _read(problem: Problem, n: int, variants: Sequence[tuple[Warm, Lag]], deadline: float) -> list[Modulo]:
    """The repetends read off each variant's list schedule of `n` micro-batches (those begun by `deadline`)."""
    found = []
    units = problem.units
    for warm, lag in variants:
        if time.perf_counter() > deadline:
            break
        try:
            starts = {k: int(t) for k, t in earliest_starts(units, n, _interleaved_orders(units, n, warm, lag)).items()}
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
    18, 42, then 36 apart, the load bound)."""
    first, dur = problem.block_ids[0], problem.duration
    best: tuple[int, int, dict[tuple[str, int], int]] | None = None  # period, span, pattern
    for k in range(n // 4, 3 * n // 4 - copies):
        pattern = {(b, j): starts[(b, k + j)] for b in problem.block_ids for j in range(copies)}
        span = max(t + dur[b] for (b, _), t in pattern.items()) - min(pattern.values())
        for period in sorted({copies * problem.period_bound, starts[(first, k + copies)] - starts[(first, k)]}):
            if period < copies * problem.period_bound or (best is not None and (period, span) >= best[:2]):
                continue
            mod = Modulo.from_starts(period, pattern, copies)
            if _no_overlap(problem, mod) and fits(problem, mod):
                best = period, span, pattern
        if best is not None and best[0] == copies * problem.period_bound:
            break  # at the load bound: the windows after it are the same steady state
    return None if best is None else Modulo.from_starts(best[0], best[2], copies)
