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
memory fits, or until one micro-batch at a time (`sequential`: its period is one micro-batch's
makespan, so it always exists, and it fits whenever one micro-batch in the releases-first order
does); the solver then only polishes the span within the time limit (orchestrate.py).
"""
from __future__ import annotations

import logging
import math
import time
from bisect import bisect_right, insort
from collections.abc import Sequence

from ..errors import SearchError
from ..key import Key
from ..timing import earliest_starts
from .budget import Clock
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
Busy = list[tuple[int, int]]  # (phase, duration) on one device, sorted
MAX_STEPS = 64  # periods tried upward from the bound before one micro-batch at a time
# periods tried before the deadline may stop the climb: on a loaded machine the clock can run out
# at the bound, and one micro-batch at a time is many times longer (interleaved at 32 devices:
# fits from the bound + 1, 28 x longer one at a time)
MIN_TRIES = 4
CHECK_EVERY = 64  # blocks a construction places between looks at its deadline
CHEAP_SECONDS = 0.5  # the climb's MIN_TRIES run this long past its clock at most (interleaved-32's take ms)


def construct(problem: Problem, period: int, order: Sequence[str] | None = None,
              deadline: float = math.inf) -> Modulo | None:
    """The repetend of the pass described above at this period, or None when a block finds no
    phase (or the time.perf_counter() `deadline` passes: a pass is quadratic in a device's blocks)."""
    busy: list[Busy] = [[] for _ in range(problem.units.devices)]
    starts: dict[str, int] = {}
    for i, b in enumerate(order or problem.block_ids):
        if not i % CHECK_EVERY and time.perf_counter() > deadline:
            return None
        ready = max((starts[a] + problem.gap(a, b) for a in problem.units.preds[b]), default=0)
        t = _earliest(busy, problem.devices_of[b], ready, problem.duration[b], period)
        if t is None:
            return None
        starts[b] = t
        _take(busy, problem.devices_of[b], t % period, problem.duration[b])
    return Modulo.from_starts(period, {(b, 0): s for b, s in starts.items()})


def _earliest(busy: list[Busy], devices: Sequence[int], ready: int, dur: int, T: int) -> int | None:
    """Earliest t >= ready with [t, t + dur) free modulo T on every device, within one period."""
    candidates = {ready} | {ready + (p + d - ready) % T for dev in devices for p, d in busy[dev]}
    for t in sorted(candidates):
        if all(_free(busy[dev], t % T, dur, T) for dev in devices):
            return t
    return None


def _free(busy: Busy, phase: int, dur: int, T: int) -> bool:
    """[phase, phase + dur) overlaps no interval of the circle: only the interval starting at or
    before the phase and the next one after it can overlap (busy is sorted and never overlaps)."""
    if not busy:
        return True
    i = bisect_right(busy, (phase, T + 1)) - 1
    p, d = busy[i]  # i = -1: the last one, which may wrap past T
    q, _ = busy[(i + 1) % len(busy)]
    return (phase - p) % T >= d and (q - phase) % T >= dur


def _take(busy: list[Busy], devices: Sequence[int], phase: int, dur: int) -> None:
    for d in devices:
        insort(busy[d], (phase, dur))


def packed(problem: Problem, period: int, deadline: float = math.inf) -> Modulo | None:
    """The paper's construction proper: pack every device's blocks into one period ignoring
    dependencies (blocks on many devices first, then longest first: first fit on a circle),
    then give each block, in dependency order, the least offset that restores its inputs
    (None when the packing fails or the `deadline` passes)."""
    busy: list[Busy] = [[] for _ in range(problem.units.devices)]
    rank = {b: i for i, b in enumerate(problem.block_ids)}
    phase: dict[str, int] = {}
    ranked = sorted(problem.block_ids, key=lambda b: (-len(problem.devices_of[b]), -problem.duration[b], rank[b]))
    for i, b in enumerate(ranked):
        if not i % CHECK_EVERY and time.perf_counter() > deadline:
            return None
        t = _earliest(busy, problem.devices_of[b], 0, problem.duration[b], period)
        if t is None:
            return None
        phase[b] = t
        _take(busy, problem.devices_of[b], t, problem.duration[b])
    starts: dict[str, int] = {}
    for b in problem.block_ids:
        ready = max((starts[a] + problem.gap(a, b) for a in problem.units.preds[b]), default=0)
        starts[b] = ready + (phase[b] - ready) % period
    return Modulo.from_starts(period, {(b, 0): s for b, s in starts.items()})


def constructions(problem: Problem, period: int, deadline: float = math.inf) -> list[Modulo]:
    """Every construction that exists at this period (and is built by the time.perf_counter()
    `deadline`), shortest span first."""
    built = [construct(problem, period, o, deadline) for o in _orders(problem)] + [packed(problem, period, deadline)]
    return sorted((m for m in built if m is not None), key=lambda m: m.span(problem))


def starting_repetend(problem: Problem, clock: Clock | None = None) -> Modulo:
    """The smallest period, from the load bound up, with a construction that fits memory; when
    none is found before `clock` runs out (after MIN_TRIES periods at least), one micro-batch at
    a time.

    Raises NoFitError when not even one micro-batch at a time fits in that order (the caller
    then asks the solver whether any order does)."""
    one = sequential(problem)
    T, step = problem.period_bound, max(1, problem.period_bound // 100)
    # Little's law: below the floor no repetend fits memory, so none is built there (at 4,096
    # devices under a limit the constructions below it took seconds each); the periods tried are
    # the same, so is the first that fits
    floor, tried = problem.memory_period_bound, 0
    # MIN_TRIES while they are cheap: CHEAP_SECONDS (or its clock again) past its clock the climb
    # stops, a construction midway (one try at 5,000 blocks took 4 s: four ran 12 s on a 5 s limit)
    stop = math.inf if clock is None else clock.deadline + max(clock.limit, CHEAP_SECONDS)
    for i in range(MAX_STEPS):
        if T >= one.period or (clock is not None and clock.expired() and
                               (tried >= MIN_TRIES or time.perf_counter() > stop)):
            break
        if T >= floor:
            tried += 1
            fitting = [m for m in constructions(problem, T, stop) if fits(problem, m)]
            if fitting:
                return fitting[0]
        T += step if i < 8 else step * (2 ** (i - 7))
    if not fits(problem, one):
        raise NoFitError(f"one micro-batch at a time does not fit the memory of {problem.placement.name!r}")
    return one


def sequential(problem: Problem) -> Modulo:
    """One micro-batch at a time: its blocks in the order that releases memory first, each as
    early as its inputs and devices allow, and the period its makespan, so micro-batches never
    overlap and the steady state holds what one micro-batch holds."""
    order = _orders(problem)[1]
    devices: list[list[Key]] = [[] for _ in range(problem.units.devices)]
    for b in order:  # one pass: a scan of every block per device was quadratic at 4,096 devices
        for d in problem.devices_of[b]:
            devices[d].append((b, 0))
    starts = earliest_starts(problem.units, 1, devices)
    span = max(int(s) + problem.duration[b] for (b, _), s in starts.items())
    return Modulo.from_starts(span, {(b, 0): int(s) for (b, _), s in starts.items()})


class NoFitError(SearchError):
    """The sequential construction does not fit the memory limit."""


def _orders(problem: Problem) -> list[Sequence[str]]:
    """Dependency order, and the one that places memory-releasing blocks as soon as they are ready."""
    p = problem.units
    rank = {b: i for i, b in enumerate(p.topo_order)}
    releases_first = p.topo_sorted(lambda b: (problem.memory[b] >= 0, rank[b]))
    return [p.topo_order, releases_first]
