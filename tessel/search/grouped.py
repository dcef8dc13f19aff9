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
the memory limits (fewer warm-up forwards hold less: the variants cover the limits between
Megatron's warm-up and one group's). Linear walks, no solver.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from ..baselines.interleaved import _interleaved_orders, _looped
from ..baselines.shapes import BaselineError
from ..key import Key
from ..timing import DeadlockError, earliest_starts
from .justify import _no_overlap
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
GROUPS = 6  # groups of p micro-batches list scheduled: warm-up, cool-down and a steady middle
MOST = 4  # grouped repetends returned at most (the least period per micro-batch, then span, first)
Warm = Callable[[int, int, int], int]


def grouped(problem: Problem) -> list[Modulo]:
    """The grouped repetends of this looped placement that fit memory, best first; [] when the
    placement is not a looped pipeline."""
    units = problem.units
    try:
        chain, v = _looped(units)
    except BaselineError:
        return []
    p = units.devices
    n = p * max(GROUPS, v + 3)
    found: dict[tuple[tuple[tuple[str, int], int], ...], Modulo] = {}
    for warm, lag in _variants(p, v, bool(chain.weight)):
        try:
            starts = earliest_starts(units, n, _interleaved_orders(units, n, warm, lag))
        except DeadlockError:
            continue
        mod = _window(problem, n, p, {k: int(t) for k, t in starts.items()})
        if mod is not None:
            found.setdefault(tuple(sorted(mod.starts().items())), mod)
    ranked = sorted(found.values(), key=lambda m: (m.per_micro_batch, m.span(problem)))
    log.info("grouped repetends: %d (periods %s)", len(ranked), [m.period for m in ranked])
    return ranked[:MOST]


def _variants(p: int, v: int, split: bool) -> Iterator[tuple[Warm, Callable[[int], int]]]:
    """Warm-ups from Megatron's ((v - 1) p + 2 (p - r - 1) forwards on device r) down to one
    group's round less; W right after B, or held back r passes on device r (split only)."""
    lags: list[Callable[[int], int]] = [lambda r: 0] + ([lambda r: r, lambda r: p - 1 - r] if split else [])
    for extra in (2, 1, 0, -1):
        for lag in lags:
            yield _warm(extra), lag
    for cap in range((v - 1) * p + p - 2, 0, -1):  # tighter limits: at most `cap` forwards ahead anywhere
        for lag in lags:
            yield _warm(1, cap), lag


def _warm(extra: int, cap: int | None = None) -> Warm:
    """Device r's warm-up: the first v - 1 chunk rounds of a group, and `extra` forwards per
    device after it (Megatron's 2, ZB-H1's 1; -1 holds a group's last micro-batches back), at
    most `cap` (the activations a device holds grow with its warm-up)."""
    return lambda r, p, v: max(1, min((v - 1) * p + extra * (p - r - 1), cap or p * v))


def _window(problem: Problem, n: int, copies: int, starts: dict[Key, int]) -> Modulo | None:
    """The first window in the middle third of the schedule whose `copies` micro-batches,
    repeated every shift of the next group, form a valid repetend that fits memory."""
    first = problem.block_ids[0]
    for k in range(n // 3, 2 * n // 3 - copies):
        period = starts[(first, k + copies)] - starts[(first, k)]
        if period < copies * problem.period_bound:
            continue
        pattern = {(b, j): starts[(b, k + j)] for b in problem.block_ids for j in range(copies)}
        mod = Modulo.from_starts(period, pattern, copies)
        if _no_overlap(problem, mod) and fits(problem, mod):
            return mod
    return None
