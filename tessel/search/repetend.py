"""Mode `tessel`, first half: the repetend by modulo scheduling with CP-SAT.

For a period T and P copies (micro-batches per repetition), every (block, copy) gets a phase r in
[0, T) and an offset q >= 0 (start s = q T + r). On each device the phase intervals may not
overlap modulo T: two copies of each, [r, r + d) and [r + T, r + T + d), go into one no-overlap
(exact while d <= T, true since T >= the device load). The earliest start is 0 (_anchor).
Steady-state memory is checked at every allocation's phase with order booleans [rho_e <= rho_a]
(see modulo.py), and Little's law on each device as a linear cut that the solver's relaxation
uses (_little). The objective is the span of the pattern, which sets how long warm-up and
cool-down are.

The period search is anytime. It starts from a repetend that fits (a construction, or one
micro-batch at a time: fast.py), so a feasible period `hi` is known before any solve, and
brackets between it and the bound `lo`: the bound first, then bisection. No solve gets more
than a slice of the work (deterministic seconds: Budget.period_work, set by the search's limit,
so a loaded machine decides the same periods), so a period the solver cannot decide in its slice
is recorded as undecided and the search goes on above it. When one micro-batch per period stays above the
bound, patterns of up to MAX_COPIES micro-batches are tried for a smaller period per micro-batch.
"""
from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from .. import bounds
from .budget import Budget, Clock, Stall
from .fast import constructions, starting_repetend
from .modulo import Modulo, fits, memory_time
from .problem import Problem
from .solver import Model, PatternVar, Progress, SolveResult, VarKey, work_done

log = logging.getLogger(__name__)
MAX_COPIES = 4


IN_SPAN = "none in the hint's span"  # solve_period's status: no pattern fits within a hint over the limits (no proof)
NONE_FITS = ("infeasible", IN_SPAN)  # the statuses where a solve found that nothing fits (a proof only the first)


@dataclass(frozen=True)
class RepetendResult:
    modulo: Modulo
    found_by: str  # "solver" or "construction" (a construction that fits stood in for the solver)
    status: str  # of the solve at the chosen period: optimal (span proven), feasible, unknown, ...
    period_optimal: bool  # no repetend of up to MAX_COPIES micro-batches has a smaller period per micro-batch
    tried: tuple[tuple[int, int, str], ...]  # (copies, period, status) in the order solved
    undecided: tuple[tuple[int, int], ...]  # (copies, period) below the result that no solve decided
    seconds: float


@dataclass(frozen=True)
class _Found:
    modulo: Modulo
    found_by: str
    status: str


def modulo_model(problem: Problem, period: int, copies: int, horizon: int, objective: str = "span") -> Model:
    """The model of one repetend (see the module doc); its objective is the span, or with
    objective "hold" the most memory-time held (the deepest pattern the limits allow)."""
    m, T = Model(), period
    for j in range(copies):
        for b in problem.block_ids:
            d = problem.duration[b]
            s = m.int_var(PatternVar("s", b, j), 0, horizon - d)
            q = m.int_var(PatternVar("q", b, j), 0, horizon // T)
            r = m.int_var(PatternVar("r", b, j), 0, T - 1)
            m.equal(s, q * T + r)
            m.occupy(r, d, problem.devices_of[b], f"busy_{b}_{j}")
            m.occupy(r + T, d, problem.devices_of[b], f"wrap_{b}_{j}")
        for a, b in problem.units.edges:
            m.precede(m.vars[PatternVar("s", a, j)], m.vars[PatternVar("s", b, j)], problem.gap(a, b))
    first = problem.block_ids[0]
    for j in range(copies - 1):  # copies are interchangeable
        m.precede(m.vars[PatternVar("s", first, j)], m.vars[PatternVar("s", first, j + 1)], 0)
    _anchor(m, problem, copies)
    _steady_memory(m, problem, T, copies, horizon)
    ends = [m.vars[PatternVar("s", b, j)] + problem.duration[b] for j in range(copies) for b in problem.block_ids]
    span = m.latest("span", 0, horizon, ends)
    if objective == "hold":
        m.minimize(-_held(m, problem, copies))
    else:
        m.minimize(span, lower=int(bounds.paths(problem.units).critical_path))
    return m


def _anchor(m: Model, problem: Problem, copies: int) -> None:
    """The earliest start at 0, as Modulo.from_starts has it. A pattern shifted in time keeps its
    fit and its span, so without this the solver also searches every shift: zbv, 4 devices,
    profiled costs, V-Min's memory, period 2.98 is proven infeasible in 16 s where 30 s decided
    nothing, and xshape-6 (bench/search.py) finds its period's repetend in 0.2 s, not 0.75 s."""
    preds = problem.units.preds
    m.earliest_at([m.vars[PatternVar("s", b, j)] for b in problem.block_ids if not preds[b] for j in range(copies)], 0)


def _held(m: Model, problem: Problem, copies: int) -> Any:
    """Memory-time held by one repetition on the limited devices (linear in the starts)."""
    return sum(_memory_time(m, problem, copies, d) for d in problem.limited_devices())


def _memory_time(m: Model, problem: Problem, copies: int, d: int) -> Any:
    return memory_time(problem, lambda b, j: m.vars[PatternVar("s", b, j)], copies, d)


def _steady_memory(m: Model, problem: Problem, T: int, copies: int, horizon: int) -> None:
    events: dict[tuple[str, int], tuple[Any, Any]] = {}
    for d in problem.limited_devices():
        slots = [(b, j) for b in problem.memory_blocks(d) for j in range(copies)]
        for x in slots:
            if x not in events:
                events[x] = _event_vars(m, problem, x, T, horizon)
        for a in (x for x in slots if problem.memory[x[0]] > 0):
            terms = []
            for e in slots:
                q_e, rho_e = events[e]
                mem = problem.memory[e[0]]
                terms.append(-mem * q_e)
                before = 1 if e == a else m.is_le(rho_e, events[a][1], f"le_{e[0]}_{e[1]}_{a[0]}_{a[1]}")
                terms.append(mem * before)
            m.at_most(sum(terms), problem.cap(d))
        _little(m, problem, T, copies, d)


def _little(m: Model, problem: Problem, T: int, copies: int, d: int) -> None:
    """Little's law on device d, redundant but a linear cut CP-SAT's relaxation uses: the
    steady-state memory averaged over the period (the repetition's memory-time over T, plus
    what a repetition leaves) is at most its peak, hence the cap. It couples the phases and
    the offsets the way the order booleans above do not: zbv, 4 devices, profiled costs, V-Min's
    memory, period 2.9746 is proven infeasible in 0.4 s, not 1.9 s; at 16 devices with
    latency, periods 3.12 and 3.15 in 9.4 s and 6.2 s, not 38 s and 33 s."""
    left = copies * problem.memory_left(d)
    m.at_most(_memory_time(m, problem, copies, d), (problem.cap(d) - left) * T)


def _event_vars(m: Model, problem: Problem, slot: tuple[str, int], T: int, horizon: int) -> tuple[Any, Any]:
    """(Q, rho) of the slot's memory event: its start when it allocates, its end when it releases."""
    b, j = slot
    if problem.memory[b] > 0:
        return m.vars[PatternVar("q", b, j)], m.vars[PatternVar("r", b, j)]
    q = m.aux_var(f"qend_{b}_{j}", 0, horizon // T + 1)
    rho = m.aux_var(f"rend_{b}_{j}", 0, T - 1)
    m.equal(q * T + rho, m.vars[PatternVar("s", b, j)] + problem.duration[b])
    return q, rho


def solve_period(problem: Problem, period: int, clock: Clock | None, workers: int | None,
                 hint: Modulo | None = None, progress: Progress | None = None, copies: int = 1,
                 stall: Stall | None = None) -> SolveResult:
    """The shortest-span repetend of `copies` micro-batches with this period, if any. A `hint` at
    this period and copies bounds the span by its own; one over the memory limits answers IN_SPAN
    where nothing fits in it, not "infeasible"."""
    if clock is not None and clock.expired():  # nothing to decide: no model (seconds at thousands of blocks)
        return SolveResult("unknown", None, None, 0.0)
    usable = hint is not None and hint.period == period and hint.copies == copies
    horizon = hint.span(problem) if hint is not None and usable else _horizon(problem, period, copies)
    m = modulo_model(problem, period, copies, horizon)
    if hint is not None and usable:
        _hint(m, hint)
    res = m.solve(clock, workers, progress, phase="repetend", stall=stall,
                  report=lambda obj: {"period": problem.real(period), "span": problem.real(obj)})
    if res.status == "infeasible" and hint is not None and usable and not fits(problem, hint):
        # the hint's span keeps the model small (a construction over the memory limits, attempt's when
        # none fits: the loose horizon cost 34% on bench/random_dags.py's case 11 at 2 s), but that
        # nothing fits within it proves nothing for the period: a longer pattern may
        return replace(res, status=IN_SPAN)
    return res


def deepest(problem: Problem, mod: Modulo, clock: Clock, workers: int | None,
            stall: Stall | None = None) -> Modulo | None:
    """At `mod`'s period and copies, the repetend holding the most memory the limits allow:
    micro-batches stay in flight longer where memory is spare, so compaction and completion can
    fill the warm-up and drain the cool-down through them (None without limits or a solution)."""
    if not problem.limited_devices() or clock.expired():
        return None
    T, copies = mod.period, mod.copies
    m = modulo_model(problem, T, copies, _horizon(problem, T, copies), objective="hold")
    _hint(m, mod)
    res = m.solve(clock, workers, phase="deepest", stall=stall)
    return modulo_of(res.values, problem, T, copies) if res.found else None


def _hint(m: Model, mod: Modulo) -> None:
    for (b, j), s in mod.starts().items():
        m.hint(m.vars[PatternVar("s", b, j)], s)
        m.hint(m.vars[PatternVar("q", b, j)], mod.offset[(b, j)])
        m.hint(m.vars[PatternVar("r", b, j)], mod.phase[(b, j)])


def _horizon(problem: Problem, period: int, copies: int) -> int:
    """Latest end of a pattern worth considering (loose: room for every block to wait a period)."""
    crit = int(bounds.paths(problem.units).critical_path)
    return crit + len(problem.block_ids) * period + (copies - 1) * period


def modulo_of(values: Mapping[VarKey, int], problem: Problem, period: int, copies: int = 1) -> Modulo:
    starts = {(b, j): values[PatternVar("s", b, j)] for b in problem.block_ids for j in range(copies)}
    return Modulo.from_starts(period, starts, copies)


class _Search:
    """The period search, sharing a clock and a log of every solve."""

    def __init__(self, problem: Problem, clock: Clock, workers: int | None, progress: Progress | None,
                 budget: Budget, work: float = math.inf) -> None:
        self.problem, self.clock, self.workers, self.progress = problem, clock, workers, progress
        self.budget = budget
        self.tried: list[tuple[int, int, str]] = []
        # the span is only a proxy for warm-up length: stop polishing it once it stalls
        self.stall = budget.repetend_stall(len(problem.block_ids))
        self.work, self.work0 = work, work_done()  # deterministic seconds of solver work, all solves

    def going(self, clock: Clock | None = None) -> bool:
        """Time for one more solve on `clock` (default the search's), and work for it."""
        return (clock or self.clock).left() > self.budget.min_slice and self.work_left() > self.budget.min_slice_work

    def work_left(self) -> float:
        return self.work - (work_done() - self.work0)

    def slice(self) -> tuple[Clock, Stall]:
        """One period's solve: a share of the work the search has left (at least the least
        slice), as the stall's work (one worker: the same on a loaded machine, so the same periods
        are decided); the wall clock, Budget.work_wall seconds per deterministic second of it (and
        at most Budget.cap of the stall's), is only a safety net."""
        b = self.budget
        work = max(b.min_slice_work, self.work_left() * b.slice_share)
        stall = self.stall.within(work)
        if math.isinf(self.work):  # no budget of work: a share of the time left, as it was
            wall = max(b.min_slice, self.clock.left() * b.slice_share)
        else:
            wall = max(b.min_slice, stall.work * b.work_wall * b.slice_wall)
        return self.clock.within(min(wall, max(b.min_slice, b.cap(self.stall, self.workers)))), stall

    def attempt(self, T: int, hint: Modulo | None = None) -> tuple[_Found | None, str]:
        """One period of one micro-batch, hinted by a construction at it; a construction that fits
        memory stands in for a solve that found nothing in its slice."""
        built = constructions(self.problem, T, self.clock.deadline)  # none past the period search's clock
        fitting = [m for m in built if fits(self.problem, m)]
        if hint is None or hint.period != T or hint.copies != 1:
            hint = (fitting or built)[0] if fitting or built else None
        res = self.solve(T, hint)
        self.tried.append((1, T, res.status))
        if res.found:
            return _Found(modulo_of(res.values, self.problem, T), "solver", res.status), res.status
        # none fits the limits (at T, or within the hint's span, which the solve without them keeps)
        relaxed = self.relaxed(T, hint) if res.status not in NONE_FITS and self.going() else None
        if relaxed is not None:
            return relaxed, relaxed.status
        if fitting:
            return _Found(fitting[0], "construction", res.status), res.status
        return None, res.status

    def relaxed(self, T: int, hint: Modulo | None) -> _Found | None:
        """When the solve under the memory limits found nothing in its slice: the same period
        without them (a smaller model, often solved at once), kept when its repetend fits the
        limits after all; optimal there, it is optimal here too (same span, fewer constraints)."""
        if not self.problem.limited_devices():
            return None
        free = replace(self.problem, limit=None)
        res = self.solve(T, hint, free)
        if not res.found:
            return None
        mod = modulo_of(res.values, self.problem, T)
        if not fits(self.problem, mod):
            return None
        status = "optimal" if res.status == "optimal" else "feasible"
        self.tried.append((1, T, status))
        return _Found(mod, "solver", status)

    def solve(self, T: int, hint: Modulo | None, problem: Problem | None = None) -> SolveResult:
        """One micro-batch at period T in a slice; undecided at once when the slice cannot hold
        building the model (Budget.model_per_block: 1.6 s at 8,192 blocks, for a slice of 0.3 s)."""
        p, (clock, stall) = problem or self.problem, self.slice()
        if not self.budget.models(len(p.block_ids), clock, self.budget.model_per_block):
            return SolveResult("unknown", None, None, 0.0)
        return solve_period(p, T, clock, self.workers, hint, self.progress, 1, stall)

    def bracket(self, lo: int, best: _Found) -> _Found:
        """The smallest period of one micro-batch in [lo, best's period): the bound first, then
        bisection; an undecided period counts as a failure for the bracket (and is reported).
        A start of several micro-batches (a list schedule's: passes/start.listed) is beaten by
        periods below its period per micro-batch, and kept as it is when not."""
        hi = math.ceil(best.modulo.per_micro_batch)
        T = lo
        while lo < hi and self.going():
            found, _ = self.attempt(T)
            if found is not None and found.modulo.period < hi:
                best, hi = found, found.modulo.period
            else:
                lo = T + 1
            T = (lo + hi) // 2
        if best.found_by == "construction" and best.modulo.copies == 1 and self.going():  # polish its span
            found, _ = self.attempt(hi, best.modulo)
            if found is not None and found.found_by == "solver":
                best = found
        return best

    def proven_below(self, ratio: Fraction, floor: Fraction) -> bool:
        """Every (copies, period) with floor <= period / copies < ratio was proven infeasible."""
        bad = {(p, t) for p, t, st in self.tried if st == "infeasible"}
        size = sum(max(0, math.ceil(ratio * p) - math.ceil(floor * p)) for p in range(1, MAX_COPIES + 1))
        return size <= len(bad) and all((p, t) in bad for p, t in _below(ratio, floor))

    def undecided(self, ratio: Fraction) -> list[tuple[int, int]]:
        """The (copies, period) below `ratio` that a solve tried and could not decide in its slice."""
        return sorted({(p, t) for p, t, st in self.tried if st not in (*NONE_FITS, "optimal", "feasible")
                       and Fraction(t, p) < ratio}, key=lambda x: Fraction(x[1], x[0]))


def _below(ratio: Fraction, floor: Fraction) -> Iterator[tuple[int, int]]:
    """Every (copies, period) with floor <= period / copies < ratio, smallest ratio first (lazily:
    on a fine grid there are many)."""
    def periods(p: int) -> Iterator[tuple[Fraction, int, int]]:
        return ((Fraction(t, p), p, t) for t in range(math.ceil(floor * p), math.ceil(ratio * p)))
    return ((p, t) for _, p, t in heapq.merge(*(periods(p) for p in range(1, MAX_COPIES + 1))))


def find_repetend(problem: Problem, clock: Clock, workers: int | None = None,
                  progress: Progress | None = None, start: Modulo | None = None,
                  budget: Budget | None = None, work: float | None = None) -> RepetendResult:
    """The repetend with the smallest period per micro-batch found in time, and the shortest span
    at it; `start` is a repetend that fits (fast.starting_repetend when not given). Its solves do
    at most `work` deterministic seconds in all (default Budget.period_work of the clock's limit).

    Periods below the device-load bound and below the memory bound (Little's law) are never
    tried; those are infeasible by argument."""
    budget = budget or Budget()
    t0 = time.perf_counter()
    start = start if start is not None else starting_repetend(problem, clock.share(budget.start_share))
    run = _Search(problem, clock, workers, progress, budget, budget.period_work(clock.limit) if work is None else work)
    floor = problem.period_floor
    best = run.bracket(math.ceil(floor), _Found(start, "construction", "none"))
    if best.modulo.per_micro_batch > floor:
        best = _more_copies(run, floor, best, clock.share(budget.copies_share))
    ratio = best.modulo.per_micro_batch
    optimal = ratio == floor or run.proven_below(ratio, floor)
    return RepetendResult(best.modulo, best.found_by, best.status, optimal, tuple(run.tried),
                          tuple(run.undecided(ratio)), time.perf_counter() - t0)


def retry_undecided(problem: Problem, res: RepetendResult, clock: Clock, workers: int | None,
                    budget: Budget | None = None) -> RepetendResult:
    """The periods `res` left undecided below its own, smallest first, tried again with
    Budget.escalate times the stall's work (a large placement may need more than a stall's work
    for a first solution); the first one found replaces the result's repetend."""
    budget = budget or Budget()
    t0, tried = time.perf_counter(), list(res.tried)
    stall = budget.repetend_stall(len(problem.block_ids)).times(budget.escalate)
    for copies, T in sorted(res.undecided, key=lambda x: (Fraction(x[1], x[0]), x[0])):
        solve = clock.within(budget.cap(stall, workers))
        if clock.left() <= budget.min_slice or not budget.models(len(problem.block_ids) * copies, solve,
                                                                 budget.model_per_block):
            break  # no time for a solve, or not even for building its model
        out = solve_period(problem, T, solve, workers, None, None, copies, stall)
        tried.append((copies, T, out.status))
        if out.found:
            mod = modulo_of(out.values, problem, T, copies)
            below = tuple(x for x in res.undecided if Fraction(x[1], x[0]) < mod.per_micro_batch)
            return RepetendResult(mod, "solver", out.status, mod.per_micro_batch == problem.period_floor,
                                  tuple(tried), below, res.seconds + time.perf_counter() - t0)
    return replace(res, tried=tuple(tried), seconds=res.seconds + time.perf_counter() - t0)


def _more_copies(run: _Search, floor: Fraction, best: _Found, clock: Clock) -> _Found:
    """Patterns of 2..MAX_COPIES micro-batches, in order of period per micro-batch, until one
    beats the current repetend (each solve a slice: a hard one is skipped, not waited on)."""
    for p, t in _below(best.modulo.per_micro_batch, floor):
        if not run.going(clock):
            break
        if p == 1:
            continue
        wall, stall = run.slice()
        res = solve_period(run.problem, t, clock.within(wall.left()), run.workers, None, run.progress, p, stall)
        run.tried.append((p, t, res.status))
        if res.found:
            return _Found(modulo_of(res.values, run.problem, t, p), "solver", res.status)
    return best


def sequential_period(problem: Problem) -> int:
    """A period at which micro-batches run one after another: any single-micro-batch
    schedule then fits, so a feasible repetend exists here whenever one micro-batch fits."""
    crit = int(bounds.paths(problem.units).critical_path)
    return max(problem.period_bound, crit + sum(problem.duration.values()))
