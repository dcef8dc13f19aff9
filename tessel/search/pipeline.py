"""`search()`: the modes put together — repetend, completion, candidates, kernel, meta.

tessel: CP-SAT repetend (smallest period, shortest span), then completion.
fast:   constructed repetend, CP-SAT only polishes its span, then completion.
exact:  the tessel schedule as a hint, then the whole N-micro-batch problem in one solve.

Completion runs on a working number of micro-batches big enough for a steady state (or N
itself when N is smaller); larger N is reached by Schedule.unroll, so the search costs the
same for 100 or 10,000 micro-batches. The applicable baselines are candidates too: a user
compares against them, so the search never returns a schedule longer than theirs.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import bounds
from ..key import Key
from ..numeric import rounded
from ..placement import Number, Placement
from ..schedule import EPS, Schedule, ScheduleError
from .completion import compact, complete, makespan, plain_unroll
from .exact import solve_exact
from .fast import constructions, fast_repetend
from .kernel import kernel_starts
from .modulo import Modulo, fits, steady_memory
from .problem import Problem, make_problem
from .repetend import find_repetend, modulo_of, solve_period
from .solver import DEFAULT_WORKERS, Progress

log = logging.getLogger(__name__)
MODES = ("tessel", "fast", "exact")
DEFAULT_LIMIT = {"tessel": 120.0, "fast": 60.0, "exact": 60.0}
FREE_TASKS = 200  # most tasks one completion solve frees at each end
FREE_MICRO_BATCHES = 6  # and most micro-batches
BASELINE_TASKS = 20_000  # baselines are compared up to this many tasks (N x blocks)
WHOLE_TASKS = 160  # up to this many tasks, tessel also improves the whole schedule in one solve
KERNEL_TRIES = 8  # window starts checked by a real unroll before giving up on a candidate


@dataclass
class Clock:
    """The time budget of one search, shared by its phases."""
    limit: float
    t0: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return max(self.limit - self.elapsed(), 0.0)


@dataclass
class Run:
    problem: Problem
    micro_batches: int
    clock: Clock
    workers: int
    progress: Progress | None
    meta: dict[str, Any] = field(default_factory=dict)

    def report(self, **update: Any) -> None:
        if self.progress:
            self.progress({**update, "elapsed": round(self.clock.elapsed(), 3)})


def search(placement: Placement, micro_batches: int, memory: Number | Sequence[Number] | None = None,
           mode: str = "tessel", time_limit: float | None = None, workers: int | None = None,
           progress: Progress | None = None) -> Schedule:
    """The schedule of `micro_batches` micro-batches under per-device `memory` limits.

    Raises MemoryLimitError (a ValueError) naming the least limit per device when one
    micro-batch cannot fit; returns the best schedule found when the time limit is hit and
    says so in meta["status"].
    """
    _check_args(micro_batches, mode, time_limit, workers)
    clock = Clock(time_limit if time_limit is not None else DEFAULT_LIMIT[mode])
    run = Run(make_problem(placement, memory), micro_batches, clock, workers or DEFAULT_WORKERS, progress)
    run.meta.update(method=mode, resolution=run.problem.resolution, exact_time=run.problem.exact_time)
    if mode == "exact":
        s = _exact(run)
    else:
        mod = _tessel_repetend(run) if mode == "tessel" else _fast_repetend(run)
        s = finish(run, mod)
    run.report(phase="done", makespan=s.makespan, period=s.meta.get("period"))
    return s


def _check_args(n: int, mode: str, time_limit: float | None, workers: int | None) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"micro_batches must be a positive integer, got {n!r}")
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}; known: {', '.join(MODES)}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time limit must be > 0 seconds, got {time_limit!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")


# ---- repetends ---------------------------------------------------------------------------------
def _tessel_repetend(run: Run) -> Modulo:
    p = run.problem
    run.report(phase="repetend", period=p.real(p.period_bound))
    res = find_repetend(p, run.clock.left() * 0.5, run.workers, run.progress)
    run.meta.update(statuses={"repetend": res.status}, period_optimal=res.period_optimal,
                    periods_tried=[[c, p.real(t), st] for c, t, st in res.tried])
    run.meta.setdefault("seconds", {})["repetend"] = round(res.seconds, 3)
    return res.modulo


def _fast_repetend(run: Run) -> Modulo:
    """Constructed repetends; the solver polishes at the bound (which also repairs memory when
    no construction fits there), else the smallest fitting construction is kept."""
    p, t0 = run.problem, time.perf_counter()
    lb = math.ceil(max(p.period_bound, p.memory_period_bound))
    run.report(phase="construct", period=p.real(lb))
    at_bound = constructions(p, lb)
    fitting = [m for m in at_bound if fits(p, m)]
    seconds = {"construct": round(time.perf_counter() - t0, 3)}
    hint = (fitting or at_bound or [None])[0]
    run.report(phase="polish", period=p.real(lb))
    # polishing a fitting construction is optional (short, stops when it stalls); repairing
    # memory is what stands between the bound and a longer period, so it may take longer
    limit = min(run.clock.left() * 0.25, 10.0) if fitting else run.clock.left() * 0.5
    stall = min(5.0, max(0.5, len(p.block_ids) / 50))
    res = solve_period(p, lb, limit, run.workers, hint, run.progress, stall=stall)
    seconds["polish"] = round(res.seconds, 3)
    if res.found and (not fitting or res.objective <= fitting[0].span(p)):
        mod = modulo_of(res.values, p, lb)
    elif fitting:
        mod = fitting[0]
    else:
        mod = fast_repetend(p)
        seconds["construct"] = round(time.perf_counter() - t0 - seconds["polish"], 3)
    run.meta.update(statuses={"polish": res.status}, seconds=seconds,
                    period_optimal=mod.per_micro_batch == lb)
    return mod


# ---- completion --------------------------------------------------------------------------------
def finish(run: Run, mod: Modulo) -> Schedule:
    """Complete the repetend for N micro-batches, compare with the baselines, attach the figures."""
    p, n, t0 = run.problem, run.micro_batches, time.perf_counter()
    free, work = _sizes(p, mod, n)
    stall = min(2.0, max(0.1, free[-1] * len(p.block_ids) / 1000))
    plain = compact(p, work, plain_unroll(mod, work))
    done = complete(p, plain, work, free, run.clock.left(), run.workers, stall, p.lower_bound(work))
    statuses = {"completion": list(done.statuses)}
    s = _own(run, mod, work, [done.starts, plain])
    run.report(phase="completion", makespan=s.makespan, period=_per_micro_batch(p, mod))
    secs = run.meta.setdefault("seconds", {})
    secs["completion"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    other = _best_baseline(run, mod, free, stall, s, statuses)
    if other is not None and other.makespan < s.makespan - EPS:
        s = other
    secs["baselines"] = round(time.perf_counter() - t1, 3)
    if n == work and n * len(p.block_ids) <= WHOLE_TASKS:
        t2 = time.perf_counter()
        s = _whole(run, mod, s, stall, statuses)
        secs["whole"] = round(time.perf_counter() - t2, 3)
    secs["total"] = round(run.clock.elapsed(), 3)
    run.meta.setdefault("statuses", {}).update(statuses)
    return s.with_meta(**run.meta, **_figures(run, mod, s))


def _whole(run: Run, mod: Modulo, s: Schedule, stall: float, statuses: dict[str, Any]) -> Schedule:
    """For few tasks, one quick solve of the whole problem hinted by the best so far."""
    p, n = run.problem, run.micro_batches
    hint = {(t.block, t.micro_batch): int(round(t.start / p.resolution)) for t in s.tasks}
    res = solve_exact(p, n, run.clock.left(), run.workers, hint, stall=stall)
    statuses["whole"] = res.status
    if not res.found or p.real(res.objective) >= s.makespan - EPS:
        return s
    starts = {key: v for key, v in res.values.items() if isinstance(key, tuple)}
    return _schedule(p, n, starts, [(mod.period, mod.copies)], "whole") or _schedule(p, n, starts, [], "whole")


def _sizes(p: Problem, mod: Modulo, n: int) -> tuple[list[int], int]:
    """The counts of micro-batches freed at each end in turn, and the working N: enough
    micro-batches for a steady state between warm-up and cool-down (and N minus it a multiple
    of the repetend's micro-batches, so it unrolls to N), or N itself when smaller."""
    g, copies = mod.in_flight(p), mod.copies
    most = max(1, min(copies * (g + 1), FREE_MICRO_BATCHES, FREE_TASKS // len(p.block_ids), n // 2))
    free = sorted({min(3, most), most})
    work = 2 * most + copies * (2 * g + 2)
    if work >= n:
        return free, n
    return free, work + (n - work) % copies


def _own(run: Run, mod: Modulo, work: int, candidates: list[dict[Key, int]]) -> Schedule:
    """The shortest completed schedule whose steady state repeats (it unrolls to N); when N is
    the working N, a shorter one without a kernel is taken too."""
    p, n = run.problem, run.micro_batches
    ranked = sorted(candidates, key=lambda st: makespan(p, st)) + [plain_unroll(mod, work)]
    for starts in ranked:
        s = _schedule(p, work, starts, [(mod.period, mod.copies)], "repetend")
        if s is not None:
            break
        if n == work:
            s = _schedule(p, work, starts, [], "repetend")
            break
    assert s is not None, "the plain unroll always repeats"
    return s.unroll(n) if n > work else s


def _best_baseline(run: Run, mod: Modulo, free: int, stall: float, own: Schedule,
                   statuses: dict[str, Any]) -> Schedule | None:
    """The best applicable baseline at N, compacted and completed when it beats our own."""
    p, n = run.problem, run.micro_batches
    if n * len(p.block_ids) > BASELINE_TASKS:
        return None
    runs = _baselines(p, n)
    if not runs:
        return None
    name, base = min(runs.items(), key=lambda kv: kv[1].makespan)
    starts = compact(p, n, {key: int(round(v)) for key, v in base.start.items()})
    if p.real(makespan(p, starts)) >= own.makespan:
        return None
    done = complete(p, starts, n, free, run.clock.left(), run.workers, stall, p.lower_bound(n))
    statuses["completion_" + name] = list(done.statuses)
    kernels = [(mod.period, mod.copies)]
    if base.repetend is not None:
        kernels.append((int(round(base.repetend.period)), _shift(base)))
    return _schedule(p, n, done.starts, kernels, name) or _schedule(p, n, done.starts, [], name)


def _shift(s: Schedule) -> int:
    kernel = s.kernel()
    return max(1, kernel.shift) if kernel else 1


def _baselines(p: Problem, n: int) -> dict[str, Schedule]:
    """Every applicable baseline on the grid placement; those that cannot run are skipped."""
    try:
        from ..baselines import BASELINES, applicable
    except ImportError:
        return {}
    out = {}
    for name in applicable(p.units):
        try:
            out[name] = BASELINES[name](p.units, n, p.limit)
        except Exception as e:  # an optional candidate: a baseline that cannot run is skipped
            log.info("baseline %s not a candidate: %s", name, e)
    return out


def _schedule(p: Problem, n: int, starts: Mapping[Key, int], kernels: Sequence[tuple[int, int]],
              base: str) -> Schedule | None:
    """The real schedule with the first kernel (period, shift) a real unroll confirms; with no
    kernels asked for, the schedule without one; else None."""
    if not kernels:
        return p.schedule(n, starts, None, None, {"base": base, "repetend": "none"})
    for period, shift in kernels:
        for i, start in enumerate(kernel_starts(starts, n, len(p.block_ids), period, shift)):
            if i >= KERNEL_TRIES:
                break
            s = p.schedule(n, starts, (start, start + period), period, {"base": base})
            try:
                s.unroll(n + shift)
                return s
            except ScheduleError as e:
                log.info("kernel at %s does not unroll: %s", start, e)
    return None


def _figures(run: Run, mod: Modulo, s: Schedule) -> dict[str, Any]:
    p = run.problem
    lb = s.lower_bound
    return {"period": _per_micro_batch(p, mod), "repetend_micro_batches": mod.copies,
            "period_lower_bound": bounds.period_lower_bound(p.placement),
            "period_memory_bound": round(float(p.memory_period_bound) * p.resolution, 6),
            "span": p.real(mod.span(p)), "in_flight": mod.in_flight(p),
            "steady_memory": [x / p.memory_scale if p.memory_scale > 1 else x for x in steady_memory(p, mod)],
            "lower_bound": lb, "gap": round(s.makespan / lb - 1, 4),
            "search_seconds": round(run.clock.elapsed(), 3), "status": _status(run, s)}


def _per_micro_batch(p: Problem, mod: Modulo) -> Number:
    return rounded(p.real(mod.period) / mod.copies, 6)


def _status(run: Run, s: Schedule) -> str:
    if math.isclose(s.makespan, s.lower_bound):
        return "optimal"
    return "time_limit" if run.clock.left() <= 0 else "feasible"


# ---- exact -------------------------------------------------------------------------------------
def _exact(run: Run) -> Schedule:
    """The tessel schedule first (a share of the time), then one solve of everything hinted by it."""
    p, n = run.problem, run.micro_batches
    share = Clock(run.clock.limit * 0.3)
    sub = Run(p, n, share, run.workers, run.progress, {"method": "tessel"})
    hint_schedule = finish(sub, _tessel_repetend(sub))
    hint = {(t.block, t.micro_batch): int(round(t.start / p.resolution)) for t in hint_schedule.tasks}
    res = solve_exact(p, n, run.clock.left(), run.workers, hint, run.progress)
    lb = p.lower_bound(n)
    meta = {**run.meta, "statuses": {"exact": res.status}, "hint_makespan": hint_schedule.makespan,
            "bound": p.real(res.bound if res.bound is not None else lb),
            "seconds": {"hint": round(share.elapsed(), 3), "exact": round(res.seconds, 3)}}
    if res.found and res.objective <= makespan(p, hint):
        starts = {key: v for key, v in res.values.items() if isinstance(key, tuple)}
        s = p.schedule(n, starts, None, None, {"base": "exact"})
    else:
        s = hint_schedule
    status = "optimal" if res.status == "optimal" else ("time_limit" if run.clock.left() <= 0 else res.status)
    gap = round(s.makespan / max(meta["bound"], 1e-12) - 1, 4)
    return s.with_meta(**meta, status=status, gap=gap, lower_bound=s.lower_bound,
                       search_seconds=round(run.clock.elapsed(), 3))
