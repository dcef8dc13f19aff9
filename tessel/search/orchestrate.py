"""`search()`: the orchestrator of the modes — the starting schedule, the repetend, completion,
the candidates raced against it, a final compaction on the real durations, and the report.

Every mode is anytime (budget.py): before any solve it holds a valid schedule, the best of the
applicable baselines and a repetend that fits memory (a construction, or one micro-batch at a
time), and every later step only replaces it by a better one.

tessel: the period search brackets between that repetend's period and the bound (periods it left
        undecided are tried again with more work on the clock it left), then completion.
fast:   constructed repetend, the solver only polishes its span (stops when it stalls), completion.
exact:  the tessel schedule as a hint, then the whole N-micro-batch problem in one solve.

Completion runs twice where memory is limited: on the least-span repetend, and on the deepest one
at the same period (repetend.deepest: the most memory-time the limits allow, so more micro-batches
in flight where a device has room); compaction then fills the warm-up and drains the cool-down
through the deeper pattern (ZB-H2's shape on `zb`, found, not copied). The shorter one is kept.

Completion runs on a working number of micro-batches big enough for a steady state (or N
itself when N is smaller); larger N is reached by Schedule.unroll, so the search costs the
same for 100 or 10,000 micro-batches. The applicable baselines race against the result up to
BASELINE_TASKS tasks (N x blocks) and while one fits the race's share of the clock (budget.py):
the search never returns a schedule longer than any baseline that ran. At the end the schedule
is replayed on the real durations (order kept), so rounding durations up to the integer grid
costs nothing against a baseline.

The bound in the report is the best proven one: FORMAT.md's, the fill through all-device blocks,
Little's law on the memory limit (bounds.py), or a CP-SAT bound on an exact grid.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .. import bounds
from ..baselines import BASELINES, BaselineError, raced, run_baseline, with_repetend
from ..errors import TesselError
from ..key import Key
from ..numeric import fmt, rounded
from ..placement import Number, Placement
from ..schedule import EPS, Repetend, Schedule, ScheduleError
from ..timing import orders_of, schedule_from_orders
from .budget import DEFAULT_LIMIT, MODES, OBJECTIVES, Budget, Clock
from .completion import compact, complete, makespan, plain_unroll
from .exact import solve_exact
from .fast import NoFitError, constructions, sequential, starting_repetend
from .kernel import kernel_starts
from .modulo import Modulo, fits, steady_memory
from .polish import polish
from .problem import MemoryLimitError, Problem, least_memory, make_problem
from .repetend import RepetendResult, deepest, find_repetend, modulo_of, retry_undecided, solve_period
from .report import SearchReport
from .solver import DEFAULT_WORKERS, Progress

log = logging.getLogger(__name__)
FREE_TASKS = 800  # most tasks one completion solve frees at each end
FREE_MICRO_BATCHES = 6  # and most micro-batches
BASELINE_TASKS = 40_000  # baselines race against the search up to this many tasks (N x blocks)
WHOLE_TASKS = 160  # up to this many tasks, tessel also improves the whole schedule in one solve
KERNEL_TRIES = 8  # window starts checked by a real unroll before giving up on a candidate
PATIENCE = 4  # the second round of completion waits this many times longer for an improvement


@dataclass
class Run:
    problem: Problem
    micro_batches: int
    clock: Clock
    workers: int
    progress: Progress | None
    budget: Budget
    objective: str = "makespan"
    statuses: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    solver_bound: int | None = None  # grid units: a bound on the makespan proven by a solve

    def report(self, **update: Any) -> None:
        if self.progress:
            self.progress({**update, "elapsed": round(self.clock.elapsed(), 3)})

    def lap(self, phase: str, since: float) -> None:
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + time.perf_counter() - since, 3)

    def value(self, s: Schedule) -> Number:
        return objective_value(s, self.objective)


def objective_value(s: Schedule, objective: str = "makespan") -> Number:
    """The makespan, or the span: the longest time from a device's first start to its last end
    (the iteration time when iterations overlap)."""
    if objective == "makespan":
        return s.makespan
    spans = [orders[-1].start + s.placement.by_id[orders[-1].block].duration - orders[0].start
             for orders in s.device_orders() if orders]
    return max(spans)


def search(placement: Placement, micro_batches: int, memory: Number | Sequence[Number] | None = None,
           mode: str = "tessel", time_limit: float | None = None, workers: int | None = None,
           progress: Progress | None = None, objective: str = "makespan", started: float | None = None,
           budget: Budget | None = None) -> Schedule:
    """The schedule of `micro_batches` micro-batches under per-device `memory` limits.

    Raises MemoryLimitError (a ValueError) naming the least limit per device when one
    micro-batch cannot fit; otherwise returns a valid schedule within the time limit (a wall
    clock from `started`, a time.perf_counter() value, default now), the best found, and says
    how it got it in meta (SearchReport). `budget` shares the clock between the phases (default
    Budget(); Budget(race=False) leaves the baselines out, to measure the search on its own)."""
    t0 = time.perf_counter() if started is None else started
    _check_args(micro_batches, mode, time_limit, workers, objective)
    budget = budget or Budget()
    problem = make_problem(placement, memory)
    limit = time_limit if time_limit is not None else DEFAULT_LIMIT[mode]
    if mode == "fast":
        limit = min(limit, budget.fast_limit(len(placement.blocks)))
    limit -= budget.reserve(limit, micro_batches * len(placement.blocks))
    run = Run(problem, micro_batches, Clock(limit, t0), workers or DEFAULT_WORKERS, progress, budget, objective)
    rivals = _race(run, budget.fast_race_share if mode == "fast" else budget.race_share)
    start = _start(run, rivals)
    res: RepetendResult | None = None
    mod: Modulo | None = None
    if isinstance(start, Schedule):  # no repetend was found in time; a baseline stands in
        s = start
    elif mode == "exact":
        s, mod = _exact(run, start, rivals)
    else:
        res = _tessel_repetend(run, start) if mode == "tessel" else _fast_repetend(run, start)
        s, mod = finish(run, res.modulo, rivals)
    s = _final(run, s, rivals)
    report = _report(run, mode, s, mod, res)
    run.report(phase="done", makespan=s.makespan, period=report.period)
    return s.with_meta(**report.to_meta())


def _check_args(n: int, mode: str, time_limit: float | None, workers: int | None, objective: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise TesselError(f"micro_batches must be a positive integer, got {n!r}")
    if mode not in MODES:
        raise TesselError(f"unknown search mode {mode!r}; known: {', '.join(MODES)}")
    if objective not in OBJECTIVES:
        raise TesselError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if time_limit is not None and not time_limit > 0:
        raise TesselError(f"time limit must be > 0 seconds, got {time_limit!r}")
    if workers is not None and workers < 1:
        raise TesselError(f"workers must be >= 1, got {workers!r}")


# ---- the starting point ------------------------------------------------------------------------
def _race(run: Run, share: float) -> list[Schedule]:
    """The applicable baselines on the real placement, greedy (the slowest) last: the schedules
    to beat from the start. One that would take more than `share` of the clock left is skipped."""
    p, n = run.problem.placement, run.micro_batches
    tasks = n * len(p.blocks)
    if tasks > BASELINE_TASKS or not run.budget.race:
        return []
    t0, out = time.perf_counter(), []
    per_baseline = tasks * run.budget.baseline_per_task
    for name in sorted(raced(p), key=lambda x: x == "greedy"):
        if per_baseline > run.clock.left() * share:
            log.info("baseline %s skipped: about %.1fs, over the race's share", name, per_baseline)
            continue
        t1 = time.perf_counter()
        try:  # without its repetend: a few times cheaper; found later if this one wins
            out.append(run_baseline(name, p, n, run.problem.real_limit(), repetend=False))
        except (BaselineError, ScheduleError) as e:  # it does not fit this placement or memory
            log.info("baseline %s not a candidate: %s", name, e)
        per_baseline = time.perf_counter() - t1
    run.lap("baselines", t0)
    return out


def _start(run: Run, rivals: Sequence[Schedule]) -> Modulo | Schedule:
    """A repetend that fits memory; raises MemoryLimitError when the solver proves that not even
    one micro-batch fits; the best baseline when neither is decided in time."""
    p, t0 = run.problem, time.perf_counter()
    try:
        mod = starting_repetend(p, t0 + run.clock.left() * run.budget.start_share)
    except NoFitError:
        res = solve_exact(p, 1, run.clock.left() * run.budget.fit_share, run.workers)
        run.statuses["fit"] = res.status
        if res.status == "infeasible":
            raise _no_fit(p) from None
        if not res.found:
            if rivals:
                return min(rivals, key=run.value)
            raise MemoryLimitError(f"no schedule of {p.placement.name!r} found within the time limit: "
                                   f"one micro-batch at a time does not fit the memory limit "
                                   f"{_fmt_list(p.real_limit())} in the order tried; give a longer time limit "
                                   f"or raise the limits") from None
        starts = {(b, 0): v for (b, _), v in _task_values(res.values).items()}
        mod = Modulo.from_starts(makespan(p, _task_values(res.values)), starts)
    run.lap("start", t0)
    return mod


def _no_fit(p: Problem) -> MemoryLimitError:
    """The solver proved that no order of one micro-batch fits: name, per device over its limit,
    what one micro-batch at a time reaches (limits that work) and the proven least."""
    scale = p.memory_scale
    one = steady_memory(p, sequential(p))
    least = least_memory(p.units)
    limit = p.limit or ()
    where = ", ".join(f"device {d} reaches {_real_memory(one[d], scale)} one micro-batch at a time (limit "
                      f"{_real_memory(limit[d], scale)}, proven least {_real_memory(least[d], scale)})"
                      for d in range(len(one)) if one[d] > limit[d])
    works = fmt([_real_memory(x, scale) for x in one], digits=6)
    return MemoryLimitError(f"no order of one micro-batch of {p.placement.name!r} fits the memory limit "
                            f"{_fmt_list(p.real_limit())} (proven by the solver): {where}; limits that work: "
                            f"--memory {works}")


def _real_memory(x: int, scale: int) -> Number:
    return x if scale == 1 else rounded(x / scale, 6)


def _task_values(values: Mapping[Any, int]) -> dict[Key, int]:
    return {key: v for key, v in values.items() if isinstance(key, tuple) and len(key) == 2}


# ---- repetends ---------------------------------------------------------------------------------
def _tessel_repetend(run: Run, start: Modulo) -> RepetendResult:
    p, t0 = run.problem, time.perf_counter()
    run.report(phase="repetend", period=p.real(p.period_bound))
    stall = run.budget.repetend_stall(len(p.block_ids))
    res = find_repetend(p, run.clock.left() * run.budget.repetend_share, run.workers, run.progress, start, stall)
    if res.undecided:  # the clock the period search left: the undecided periods get more work
        res = retry_undecided(p, res, run.clock.left() * run.budget.retry_share, run.workers, stall)
    run.statuses["repetend"] = res.status
    run.statuses["periods_tried"] = [[c, p.real(t), st] for c, t, st in res.tried]
    run.lap("repetend", t0)
    return res


def _fast_repetend(run: Run, start: Modulo) -> RepetendResult:
    """Constructed repetends; the solver polishes at the bound (which also repairs memory when
    no construction fits there), else the starting repetend is kept."""
    p, t0 = run.problem, time.perf_counter()
    lb = math.ceil(max(Fraction(p.period_bound), p.memory_period_bound))
    run.report(phase="construct", period=p.real(lb))
    at_bound = constructions(p, lb) if start.period > lb else [start]
    fitting = [m for m in at_bound if fits(p, m)]
    run.lap("construct", t0)
    t1 = time.perf_counter()
    hint = (fitting or at_bound)[0] if fitting or at_bound else None
    run.report(phase="polish", period=p.real(lb))
    b = run.budget
    limit = min(run.clock.left() * b.polish_share, b.polish_cap) if fitting else run.clock.left() * b.repair_share
    res = solve_period(p, lb, limit, run.workers, hint, run.progress, stall=b.repetend_stall(len(p.block_ids)))
    run.lap("polish", t1)
    run.statuses["polish"] = res.status
    mod, by = start, "construction"
    if res.found and (not fitting or res.objective is None or res.objective <= fitting[0].span(p)):
        mod, by = modulo_of(res.values, p, lb), "solver"
    elif fitting:
        mod = fitting[0]
    optimal = mod.per_micro_batch == max(p.period_bound, p.memory_period_bound)
    return RepetendResult(mod, by, res.status, optimal, ((1, lb, res.status),), (), time.perf_counter() - t0)


# ---- completion --------------------------------------------------------------------------------
def finish(run: Run, mod: Modulo, rivals: Sequence[Schedule]) -> tuple[Schedule, Modulo]:
    """Complete the repetend for N micro-batches (and the deepest repetend at its period, which
    uses the memory the limits leave), compare with the baselines completed on the grid; the
    schedule and the repetend it completes."""
    p, n, t0 = run.problem, run.micro_batches, time.perf_counter()
    s = _completed(run, mod)
    run.lap("completion", t0)
    s, mod = _deeper(run, mod, s)
    free, work = _sizes(p, mod, n)
    stall = run.budget.completion_stall(free[-1], len(p.block_ids))
    t1 = time.perf_counter()
    based = _completed_baseline(run, mod, free, stall, s, rivals)
    if based is not None and run.value(based) < run.value(s) - EPS:
        s = based
    run.lap("baselines", t1)
    if n == work and n * len(p.block_ids) <= WHOLE_TASKS and run.clock.left() > 0:
        t2 = time.perf_counter()
        s = _whole(run, mod, s, stall)
        run.lap("whole", t2)
    return s, mod


def _deeper(run: Run, mod: Modulo, s: Schedule) -> tuple[Schedule, Modulo]:
    """The deepest repetend at mod's period (more micro-batches in flight where the memory
    limits leave room), completed; it replaces `s` when shorter."""
    p, t0 = run.problem, time.perf_counter()
    if run.value(s) <= _lower_bound(run)[0] + EPS:  # already at the proven bound: nothing to gain
        return s, mod
    deep = deepest(p, mod, run.clock.left() * run.budget.deep_share, run.workers,
                   run.budget.repetend_stall(len(p.block_ids)))
    if deep is not None and deep.in_flight(p) > mod.in_flight(p) and run.clock.left() > 0:
        other = _completed(run, deep, "completion_deep")
        if run.value(other) < run.value(s) - EPS:
            s, mod = other, deep
    run.lap("deepest", t0)
    return s, mod


def _completed(run: Run, mod: Modulo, phase: str = "completion") -> Schedule:
    """The repetend completed (warm-up and cool-down solves, compaction) and unrolled to N."""
    p, n = run.problem, run.micro_batches
    free, work = _sizes(p, mod, n)
    stall = run.budget.completion_stall(free[-1], len(p.block_ids))
    plain = compact(p, work, plain_unroll(mod, work))
    done = complete(p, plain, work, free, run.clock.left(), run.workers, stall, p.lower_bound(work))
    statuses = list(done.statuses)
    first = done.starts
    if makespan(p, first) > p.lower_bound(work) and run.clock.left() > PATIENCE * stall * 2 * len(free):
        # a solve stopped on a stall is at the mercy of the machine's load: go again, more patiently
        done = complete(p, first, work, free, run.clock.left(), run.workers, PATIENCE * stall, p.lower_bound(work))
        statuses += done.statuses
    run.statuses[phase] = statuses
    s = _own(run, mod, work, [done.starts, first, plain])
    run.report(phase=phase, makespan=s.makespan, period=_per_micro_batch(p, mod))
    return s


def _whole(run: Run, mod: Modulo, s: Schedule, stall: float) -> Schedule:
    """For few tasks, one quick solve of the whole problem hinted by the best so far."""
    p, n = run.problem, run.micro_batches
    hint = _grid_starts(p, s)
    if hint is None:
        return s
    res = solve_exact(p, n, run.clock.left(), run.workers, hint, stall=stall)
    run.statuses["whole"] = res.status
    _note_bound(run, res.status, res.bound)
    if not res.found or res.objective is None or p.real(res.objective) >= s.makespan - EPS:
        return s
    starts = _task_values(res.values)
    return _schedule(p, n, starts, [(mod.period, mod.copies)], "whole") or _schedule(p, n, starts, [], "whole") or s


def _note_bound(run: Run, status: str, bound: int | None) -> None:
    """A makespan bound a solve proved on the grid; it holds for the real durations only when
    the grid is exact (a rounded-up grid proves bounds of longer blocks)."""
    if bound is not None and status in ("optimal", "feasible") and run.problem.exact_time \
            and run.objective == "makespan":
        run.solver_bound = max(run.solver_bound or 0, bound)


def _grid_starts(p: Problem, s: Schedule) -> dict[Key, int] | None:
    """The schedule's starts on the grid, when they are grid times."""
    out = {}
    for t in s.tasks:
        x = t.start / p.resolution
        if abs(x - round(x)) > 1e-6:
            return None
        out[(t.block, t.micro_batch)] = int(round(x))
    return out


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
    s = None
    for starts in ranked:
        s = _schedule(p, work, starts, [(mod.period, mod.copies)], "repetend")
        if s is not None:
            break
        if n == work:
            s = _schedule(p, work, starts, [], "repetend")
            break
    assert s is not None, "the plain unroll always repeats"
    return s.unroll(n) if n > work else s


def _completed_baseline(run: Run, mod: Modulo, free: list[int], stall: float, own: Schedule,
                        rivals: Sequence[Schedule]) -> Schedule | None:
    """The best baseline on the grid, compacted and completed, when it beats our own."""
    p, n = run.problem, run.micro_batches
    grid = _grid_baselines(run, rivals)
    if not grid or run.clock.left() <= 0:
        return None
    name, base = min(grid.items(), key=lambda kv: kv[1].makespan)
    starts = compact(p, n, {key: int(round(v)) for key, v in base.start.items()})
    if p.real(makespan(p, starts)) >= own.makespan:
        return None
    done = complete(p, starts, n, free, run.clock.left(), run.workers, stall, p.lower_bound(n))
    run.statuses["completion_" + name] = list(done.statuses)
    kernels = [(mod.period, mod.copies)]
    if base.repetend is not None:
        kernels.append((int(round(base.repetend.period)), _shift(base)))
    return _schedule(p, n, done.starts, kernels, name) or _schedule(p, n, done.starts, [], name)


def _grid_baselines(run: Run, rivals: Sequence[Schedule]) -> dict[str, Schedule]:
    """The baselines on the grid placement: the real ones when the grid is exact, else run again
    on the grid's (rounded-up) durations."""
    p, n = run.problem, run.micro_batches
    if p.exact_time and p.resolution == 1:
        return {str(s.meta["method"]): s for s in rivals}
    out = {}
    for s in rivals:
        name = str(s.meta["method"])
        if float(s.meta.get("search_seconds", 0)) * 3 > run.clock.left():
            continue  # the rounded-up durations often take the baseline longer
        try:
            out[name] = BASELINES[name](p.units, n, p.limit)
        except (BaselineError, ScheduleError) as e:  # rounding up may push it over the limit
            log.info("baseline %s on the grid: %s", name, e)
    return out


def _shift(s: Schedule) -> int:
    kernel = s.kernel()
    return max(1, kernel.shift) if kernel else 1


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


# ---- the end: real-time compaction, the rivals, the report -------------------------------------
def _final(run: Run, s: Schedule, rivals: Sequence[Schedule]) -> Schedule:
    """The schedule replayed on the real durations (order kept: never longer, same memory
    order), then the best of it and the baselines by the objective."""
    t0 = time.perf_counter()
    if not run.problem.exact_time:
        s = _compacted(s)
    if run.objective == "makespan" and s.makespan > _lower_bound(run)[0] + EPS:
        # gaps the grid's completion left (polish.py); at most half the time spent so far (0.5 s at least)
        s = polish(s, time.perf_counter() + min(run.clock.left(), max(0.5, run.clock.elapsed() / 2)))
    best = min([s, *rivals], key=run.value)
    if best is not s and run.value(best) < run.value(s) - EPS:
        s = _with_repetend(run, best).with_meta(base=str(best.meta.get("method")))
    run.lap("final", t0)
    return s


def _with_repetend(run: Run, rival: Schedule) -> Schedule:
    """A raced baseline that won, with its repetend (so it unrolls) when the clock allows the few
    builds that takes; as raced otherwise."""
    if run.clock.left() < run.budget.repetend_builds * float(rival.meta.get("search_seconds", 0)):
        log.info("baseline %s kept without its repetend: no time left to find it", rival.meta.get("method"))
        return rival
    return with_repetend(rival)


def _compacted(s: Schedule) -> Schedule:
    """Every device's order as early as the real durations allow; the repetend kept where the
    replayed kernel still unrolls."""
    try:
        tight = schedule_from_orders(s.placement, s.micro_batches, orders_of(s), s.memory_limit, None, s.meta)
    except ScheduleError as e:  # floating point: a release summed to just after an allocation at its time
        log.info("no real-time compaction: %s", e)
        return s
    if tight.makespan >= s.makespan - EPS:
        return s
    rep = s.repetend
    if rep is None:
        return tight
    first = min((t for t in s.tasks if t.start >= rep.start - EPS), key=lambda t: (t.start, t.micro_batch, t.block))
    at = tight.start[(first.block, first.micro_batch)]
    kept = Schedule.build(tight.placement, tight.micro_batches, tight.start, tight.memory_limit,
                          Repetend(rep.period, at, at + rep.period), tight.meta, check=False)
    try:
        shift = _shift(kept)
        kept.unroll(kept.micro_batches + shift)
    except ScheduleError as e:
        log.info("the compacted schedule keeps no repetend: %s", e)
        return tight.with_meta(repetend="none")
    return kept


def _report(run: Run, mode: str, s: Schedule, mod: Modulo | None, res: RepetendResult | None) -> SearchReport:
    p = run.problem
    lb, source = _lower_bound(run)
    value = run.value(s)
    undecided = tuple(sorted({_real_ratio(p, t, c) for c, t in res.undecided})) if res is not None else ()
    status = "optimal" if value <= lb + EPS else ("time_limit" if run.clock.left() <= 0 else "feasible")
    limit = p.real_limit()
    return SearchReport(
        method=mode, objective=run.objective, status=status, base=str(s.meta.get("base", "repetend")),
        lower_bound=_num(lb), bound_source=source, gap=round(value / lb - 1, 4) if lb > 0 else 0.0,
        search_seconds=round(run.clock.elapsed(), 3),
        period=None if mod is None else _per_micro_batch(p, mod),
        repetend_micro_batches=1 if mod is None else mod.copies,
        period_optimal=bool(res.period_optimal) if res is not None else bool(
            mod is not None and mod.per_micro_batch == max(p.period_bound, p.memory_period_bound)),
        periods_undecided=undecided,
        period_lower_bound=bounds.period_lower_bound(p.placement),
        period_memory_bound=round(float(p.memory_period_bound) * p.resolution, 6),
        span=None if mod is None else p.real(mod.span(p)), in_flight=None if mod is None else mod.in_flight(p),
        steady_memory=() if mod is None or limit is None else tuple(
            x / p.memory_scale if p.memory_scale > 1 else x for x in steady_memory(p, mod)),
        resolution=p.resolution, exact_time=p.exact_time, statuses=dict(run.statuses),
        seconds={**run.seconds, "total": round(run.clock.elapsed(), 3)})


def _lower_bound(run: Run) -> tuple[Number, str]:
    """The best proven lower bound of the objective, and which argument proved it."""
    p, n = run.problem, run.micro_batches
    pl = p.placement
    if run.objective == "span":  # each device's own work
        return max(n * x for x in pl.loads), "analytic"
    best: tuple[Number, str] = (bounds.lower_bound(pl, n), "analytic")
    shard = bounds.shard_lower_bound(pl, n)
    if shard > best[0] + EPS:
        best = (shard, "shard")
    limit = p.real_limit()
    for d in p.limited_devices() if limit is not None else []:
        pairs = p.memory_pairs(d)
        if pairs and limit is not None:
            holds = [(a, r, amount / p.memory_scale) for a, r, amount in pairs]
            x = bounds.memory_lower_bound(pl, n, d, holds, limit[d])
            if x > best[0] + EPS:
                best = (x, "memory")
    if run.solver_bound is not None and p.real(run.solver_bound) > best[0] + EPS:
        best = (p.real(run.solver_bound), "solver")
    return best


def _real_ratio(p: Problem, period: int, copies: int) -> Number:
    return _num(p.real(period) / copies)


def _num(x: Number) -> Number:
    return rounded(x, 6)


def _per_micro_batch(p: Problem, mod: Modulo) -> Number:
    return _num(p.real(mod.period) / mod.copies)


def _fmt_list(xs: Sequence[Number] | None) -> str:
    return fmt(list(xs or ()), digits=6)


# ---- exact -------------------------------------------------------------------------------------
def _exact(run: Run, start: Modulo, rivals: Sequence[Schedule]) -> tuple[Schedule, Modulo]:
    """The tessel schedule first (a share of the time), then one solve of everything hinted by it."""
    p, n, t0 = run.problem, run.micro_batches, time.perf_counter()
    share = run.clock.share(run.budget.exact_hint_share)
    sub = Run(p, n, share, run.workers, run.progress, run.budget, run.objective)
    res = _tessel_repetend(sub, start)
    hint_schedule, mod = finish(sub, res.modulo, rivals)
    run.statuses.update(hint=sub.statuses)
    run.lap("hint", t0)
    t1 = time.perf_counter()
    hint = _grid_starts(p, hint_schedule)
    out = solve_exact(p, n, run.clock.left(), run.workers, hint, run.progress)
    run.lap("exact", t1)
    run.statuses["exact"] = out.status
    _note_bound(run, out.status, out.bound)
    s = hint_schedule
    if out.found and out.objective is not None and p.real(out.objective) < hint_schedule.makespan - EPS:
        s = p.schedule(n, _task_values(out.values), None, None, {"base": "exact"})
    return s, mod

