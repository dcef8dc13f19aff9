"""Mode `fast`: repetends built constructively, for placements too large to solve outright.

Two constructions, the shortest span that exists is kept:

- `packed`, the TPDS paper's fast construction: each device's work of one micro-batch is packed
  into one period ignoring dependencies (first fit on a circle, blocks on many devices and long
  blocks first), then each block, in dependency order, gets the least micro-batch offset that
  restores its inputs. It exists whenever the packing does, so it reaches the load bound on
  every placement of the library.
- `construct`, the same in one pass: in dependency order a block takes the earliest phase free
  (modulo the period) on all its devices at or after its inputs are ready, the whole periods
  it waited becoming its offset. Shorter spans, but packing can fail where `packed` succeeds.

The period starts at the bound and grows until a construction exists and its steady-state
memory fits; the solver then only polishes the span within the time limit (pipeline.py).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from ..errors import SearchError
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
Busy = list[tuple[int, int]]  # (phase, duration) on one device


def construct(problem: Problem, period: int, order: Sequence[str] | None = None) -> Modulo | None:
    """The repetend of the pass described above at this period, or None when a block finds no phase."""
    busy: list[Busy] = [[] for _ in range(problem.units.devices)]
    starts: dict[str, int] = {}
    for b in order or problem.block_ids:
        ready = max((starts[a] + problem.gap(a, b) for a in problem.units.preds[b]), default=0)
        t = _earliest(busy, problem.devices_of[b], ready, problem.duration[b], period)
        if t is None:
            return None
        starts[b] = t
        for d in problem.devices_of[b]:
            busy[d].append((t % period, problem.duration[b]))
    return Modulo.from_starts(period, {(b, 0): s for b, s in starts.items()})


def _earliest(busy: list[Busy], devices: Sequence[int], ready: int, dur: int, T: int) -> int | None:
    """Earliest t >= ready with [t, t + dur) free modulo T on every device, within one period."""
    candidates = {ready} | {ready + (p + d - ready) % T for dev in devices for p, d in busy[dev]}
    for t in sorted(candidates):
        if all(_free(busy[dev], t % T, dur, T) for dev in devices):
            return t
    return None


def _free(busy: Busy, phase: int, dur: int, T: int) -> bool:
    return all((phase - p) % T >= d and (p - phase) % T >= dur for p, d in busy)


def packed(problem: Problem, period: int) -> Modulo | None:
    """The paper's construction proper: pack every device's blocks into one period ignoring
    dependencies (blocks on many devices first, then longest first: first fit on a circle),
    then give each block, in dependency order, the least offset that restores its inputs."""
    busy: list[Busy] = [[] for _ in range(problem.units.devices)]
    rank = {b: i for i, b in enumerate(problem.block_ids)}
    phase: dict[str, int] = {}
    for b in sorted(problem.block_ids, key=lambda b: (-len(problem.devices_of[b]), -problem.duration[b], rank[b])):
        t = _earliest(busy, problem.devices_of[b], 0, problem.duration[b], period)
        if t is None:
            return None
        phase[b] = t
        for d in problem.devices_of[b]:
            busy[d].append((t, problem.duration[b]))
    starts: dict[str, int] = {}
    for b in problem.block_ids:
        ready = max((starts[a] + problem.gap(a, b) for a in problem.units.preds[b]), default=0)
        starts[b] = ready + (phase[b] - ready) % period
    return Modulo.from_starts(period, {(b, 0): s for b, s in starts.items()})


def constructions(problem: Problem, period: int) -> list[Modulo]:
    """Every construction that exists at this period, shortest span first."""
    built = [construct(problem, period, o) for o in _orders(problem)] + [packed(problem, period)]
    return sorted((m for m in built if m is not None), key=lambda m: m.span(problem))


def fast_repetend(problem: Problem, max_steps: int = 64) -> Modulo:
    """The smallest period, from the load bound up, with a construction that fits memory."""
    T, step = problem.period_bound, max(1, problem.period_bound // 100)
    for i in range(max_steps):
        fitting = [m for m in constructions(problem, T) if fits(problem, m)]
        if fitting:
            return fitting[0]
        T += step if i < 8 else step * (2 ** (i - 7))
    raise SearchError(f"fast construction found no repetend for {problem.placement.name!r} up to period "
                     f"{problem.real(T)}; try mode 'tessel'")


def _orders(problem: Problem) -> list[Sequence[str]]:
    """Dependency order, and the one that places memory-releasing blocks as soon as they are ready."""
    p = problem.units
    rank = {b: i for i, b in enumerate(p.topo_order)}
    releases_first = p.topo_sorted(lambda b: (problem.memory[b] >= 0, rank[b]))
    return [p.topo_order, releases_first]
