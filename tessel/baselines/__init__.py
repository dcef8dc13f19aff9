"""Baseline schedules: gpipe, 1f1b, interleaved, chimera, the zero-bubble family, dualpipev, v-mem and greedy.

`BASELINES[name](placement, micro_batches, memory_limit)` returns a validated Schedule with
`meta = {"method": name, "search_seconds": ...}` and, where the steady state repeats, a
`repetend` that `Schedule.unroll` extends. A baseline that does not fit the placement, or whose
memory exceeds the limit, raises BaselineError saying why (tessel.baselines.schedules says how far
each one reaches).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, partial

from ..key import Key
from ..placement import Placement
from ..schedule import EPS, Schedule, normalise_limit
from ..timing import settled
from .repetend import detect, window_holds
from .schedules import REGISTRY, Baseline, Limit
from .shapes import BaselineError

__all__ = ["BASELINES", "BaselineError", "applicable", "futile", "linear", "orders", "raced", "why_not",
           "run_baseline", "with_repetend"]
log = logging.getLogger(__name__)
# the most tasks of the small schedules built to find a steady state
DETECT_TASKS = 50_000


def why_not(name: str, placement: Placement) -> str | None:
    """Why baseline `name` does not fit the placement, or None when it does."""
    try:
        _get(name).fits(placement)
    except BaselineError as e:
        return str(e)
    return None


def applicable(placement: Placement) -> list[str]:
    return [name for name in REGISTRY if why_not(name, placement) is None]


def raced(placement: Placement, linear_only: bool = False) -> list[str]:
    """The applicable baselines a search races by default (torch's generators only on request);
    with `linear_only`, those built in linear time (`linear`), the only ones whose fit is checked
    (a check walks the placement: a second for them all at 4,096 devices)."""
    return [name for name, base in REGISTRY.items()
            if base.raced and (not linear_only or base.linear(placement)) and why_not(name, placement) is None]


def linear(name: str, placement: Placement) -> bool:
    """Whether baseline `name` builds its schedule of this placement in time linear in the tasks."""
    return _get(name).linear(placement)


def orders(name: str, placement: Placement, micro_batches: int) -> list[list[Key]] | None:
    """Baseline `name`'s per-device orders before any timing, where it has them in closed form
    (gpipe; 1f1b on a plain pipeline); else None."""
    return _get(name).orders(placement, micro_batches)


def futile(name: str, placement: Placement, micro_batches: int, memory_limit: Limit) -> str | None:
    """Why racing baseline `name` under this limit is pointless (another raced baseline is known
    to be at least as short there), or None; checked without building it."""
    return _get(name).futile(placement, micro_batches, memory_limit)


def _get(name: str) -> Baseline:
    if name not in REGISTRY:
        raise BaselineError(f"unknown baseline {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _make(base: Baseline, p: Placement, limit: Limit, n: int) -> Schedule:
    return settled(p, n, base.starts(p, n, limit), check=False)  # float dust settled (tessel.dust)


def _repetend(base: Baseline, make: Callable[[int], Schedule], s: Schedule) -> Schedule:
    """`s` with its repetend, found on a schedule with the same warm-up but few micro-batches."""
    blocks = len(s.placement.blocks)
    for k in base.shifts(s.placement):
        n = s.micro_batches
        n0 = n - k * max(0, (n - blocks - 2 * k) // k)
        if (n0 + 2 * k) * blocks > DETECT_TASKS:
            log.info("%s: %d micro-batches of %d blocks are too many to look for a repetend",
                     s.placement.name, n0, blocks)
            return s
        try:
            rep = detect(make, n0, k)
        except BaselineError as e:  # more micro-batches than asked for may not fit the limit
            log.info("no repetend: %s", e)
            return s
        if rep is not None and (n0 == n or window_holds(make(n0), s, rep)):
            return replace(s, repetend=rep)
    return s


def _check_memory(name: str, s: Schedule, limit: Limit) -> None:
    lim = normalise_limit(limit, s.placement.devices)
    if lim is None:
        return
    for d, (peak, cap) in enumerate(zip(s.peak_memory, lim)):
        if peak > cap + EPS:
            raise BaselineError(f"{name} needs memory {peak:g} on device {d}, over its limit {cap:g}")


def run_baseline(name: str, placement: Placement, micro_batches: int, memory_limit: Limit = None,
                 repetend: bool = True) -> Schedule:
    """The validated schedule of baseline `name` for `micro_batches` under `memory_limit`; with
    `repetend`, its steady state found too (it unrolls), which costs a few builds more."""
    base = _get(name)
    if micro_batches < 1:
        raise BaselineError(f"micro-batches must be >= 1, got {micro_batches}")
    base.fits(placement)
    t0 = time.perf_counter()
    make = lru_cache(partial(_make, base, placement, memory_limit))
    s = make(micro_batches)
    _check_memory(name, s, memory_limit)
    s = replace(_repetend(base, make, s) if repetend else s, memory_limit=normalise_limit(memory_limit, placement.devices),
                meta={"method": name, "search_seconds": round(time.perf_counter() - t0, 4)})
    log.info("%s on %s, %d micro-batches: makespan %s", name, placement.name, micro_batches, s.makespan)
    return s.validate()


def with_repetend(s: Schedule) -> Schedule:
    """A schedule from `run_baseline(..., repetend=False)` with its repetend found now (it keeps
    its tasks; only the few shorter builds the detection needs are made)."""
    base = _get(str(s.meta.get("method")))
    make = lru_cache(partial(_make, base, s.placement, s.memory_limit))
    return _repetend(base, make, s)


BASELINES: dict[str, Callable[[Placement, int, Limit], Schedule]] = {
    name: partial(run_baseline, name) for name in REGISTRY}
