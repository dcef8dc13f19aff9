"""Mode `tessel`, first half: the repetend by modulo scheduling with CP-SAT.

For a period T and P copies (micro-batches per repetition), every (block, copy) gets a phase r in
[0, T) and an offset q >= 0 (start s = q T + r). On each device the phase intervals may not
overlap modulo T: two copies of each, [r, r + d) and [r + T, r + T + d), go into one no-overlap
(exact while d <= T, true since T >= the device load). Steady-state memory is checked at every
allocation's phase with order booleans [rho_e <= rho_a] (see modulo.py). The objective is the
span of the pattern, which sets how long warm-up and cool-down are.

T is searched upward from P times the device-load bound. One micro-batch per period (P = 1) is
tried first; when memory or packing forces its period above the bound, patterns of up to
MAX_COPIES micro-batches are tried for a smaller period per micro-batch.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .. import bounds
from ..numeric import fmt
from .fast import constructions
from .modulo import Modulo, fits
from .problem import Problem
from .solver import Model, Progress, SolveResult

log = logging.getLogger(__name__)
LINEAR_STEPS = 8  # periods tried one by one above the bound before the step doubles
MAX_COPIES = 4
COPIES_SHARE = 0.5  # of the time left that patterns of several micro-batches may take
COPY_SOLVE_SECONDS = 10.0  # per solve; infeasible ones are proven much faster


@dataclass(frozen=True)
class RepetendResult:
    modulo: Modulo
    status: str  # of the solve that produced it: optimal (span proven) or feasible
    period_optimal: bool  # no repetend of up to MAX_COPIES micro-batches has a smaller period per micro-batch
    tried: tuple[tuple[int, int, str], ...]  # (copies, period, status) in the order solved
    seconds: float


def modulo_model(problem: Problem, period: int, copies: int, horizon: int) -> Model:
    """The model of one repetend (see the module doc); its objective is the span."""
    m, T = Model(), period
    for j in range(copies):
        for b in problem.block_ids:
            d = problem.duration[b]
            s = m.int_var(("s", b, j), 0, horizon - d)
            q = m.int_var(("q", b, j), 0, horizon // T)
            r = m.int_var(("r", b, j), 0, T - 1)
            m.cp.add(s == q * T + r)
            m.occupy(r, d, problem.devices_of[b])
            m.occupy(r + T, d, problem.devices_of[b])
        for a, b in problem.units.edges:
            m.precede(m.vars[("s", a, j)], m.vars[("s", b, j)], problem.gap(a, b))
    first = problem.block_ids[0]
    for j in range(copies - 1):  # copies are interchangeable
        m.cp.add(m.vars[("s", first, j)] <= m.vars[("s", first, j + 1)])
    _steady_memory(m, problem, T, copies, horizon)
    span = m.cp.new_int_var(0, horizon, "span")
    for (kind, b, _), v in list(m.vars.items()):
        if kind == "s":
            m.cp.add(span >= v + problem.duration[b])
    m.minimize(span, lower=int(bounds.paths(problem.units).critical_path))
    return m


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
                terms.append(mem * (1 if e == a else _le(m, rho_e, events[a][1])))
            m.cp.add(sum(terms) <= problem.limit[d])


def _event_vars(m: Model, problem: Problem, slot: tuple[str, int], T: int, horizon: int) -> tuple[Any, Any]:
    """(Q, rho) of the slot's memory event: its start when it allocates, its end when it releases."""
    b, j = slot
    if problem.memory[b] > 0:
        return m.vars[("q", b, j)], m.vars[("r", b, j)]
    q = m.cp.new_int_var(0, horizon // T + 1, "")
    rho = m.cp.new_int_var(0, T - 1, "")
    m.cp.add(q * T + rho == m.vars[("s", b, j)] + problem.duration[b])
    return q, rho


def _le(m: Model, x: Any, y: Any) -> Any:
    """A boolean equal to [x <= y]."""
    v = m.bool_var()
    m.cp.add(x <= y).only_enforce_if(v)
    m.cp.add(x > y).only_enforce_if(~v)
    return v


def solve_period(problem: Problem, period: int, time_limit: float | None, workers: int | None,
                 hint: Modulo | None = None, progress: Progress | None = None, copies: int = 1,
                 stall: float | None = None) -> SolveResult:
    """The shortest-span repetend of `copies` micro-batches with this period, if any."""
    usable = hint is not None and hint.period == period and hint.copies == copies
    horizon = hint.span(problem) if usable else _horizon(problem, period, copies)
    m = modulo_model(problem, period, copies, horizon)
    if usable:
        for (b, j), s in hint.starts().items():
            m.hint(m.vars[("s", b, j)], s)
            m.hint(m.vars[("q", b, j)], hint.offset[(b, j)])
            m.hint(m.vars[("r", b, j)], hint.phase[(b, j)])
    return m.solve(time_limit, workers, progress, phase="repetend", stall=stall,
                   report=lambda obj: {"period": problem.real(period), "span": problem.real(obj)})


def _horizon(problem: Problem, period: int, copies: int) -> int:
    """Latest end of a pattern worth considering (loose: room for every block to wait a period)."""
    crit = int(bounds.paths(problem.units).critical_path)
    return crit + len(problem.block_ids) * period + (copies - 1) * period


def modulo_of(values: dict, problem: Problem, period: int, copies: int = 1) -> Modulo:
    starts = {(b, j): values[("s", b, j)] for b in problem.block_ids for j in range(copies)}
    return Modulo.from_starts(period, starts, copies)


class _Search:
    """The period search of one copy count, sharing a clock and a log of every solve."""

    def __init__(self, problem: Problem, time_limit: float, workers: int | None, progress: Progress | None,
                 hint: Modulo | None) -> None:
        self.problem, self.limit, self.workers, self.progress, self.hint = problem, time_limit, workers, progress, hint
        self.t0 = time.perf_counter()
        self.tried: list[tuple[int, int, str]] = []
        # the span is only a proxy for warm-up length: stop polishing it once it stalls
        self.stall = min(5.0, max(0.5, len(problem.block_ids) / 50))

    def left(self) -> float:
        return self.limit - (time.perf_counter() - self.t0)

    def attempt(self, copies: int, T: int) -> SolveResult:
        """One period, hinted by a construction at it; a construction that fits memory stands
        in for a solve that found nothing in time."""
        built = [m for m in constructions(self.problem, T) if copies == 1]
        fitting = [m for m in built if fits(self.problem, m)]
        hint = self.hint if self.hint is not None and self.hint.period == T else (fitting or built or [None])[0]
        res = solve_period(self.problem, T, max(self.left(), 0.05), self.workers, hint, self.progress, copies,
                           self.stall)
        if not res.found and fitting:
            res = SolveResult("constructed", fitting[0].span(self.problem), None, res.seconds,
                              {("s", b, j): t for (b, j), t in fitting[0].starts().items()})
        self.tried.append((copies, T, res.status))
        return res

    def smallest(self, copies: int, lo: int, hi: int) -> tuple[int, SolveResult] | None:
        """The smallest feasible period in [lo, hi]: upward, one by one then doubling steps,
        then bisected back down to the last period found infeasible."""
        best, T, step, n = None, lo, 1, 0
        while T <= hi and self.left() > 0:
            res = self.attempt(copies, T)
            n += 1
            if res.found:
                best = (T, res)
                break
            lo = T + 1
            step = step * 2 if n >= LINEAR_STEPS else 1
            T = min(T + step, hi) if T < hi else hi + 1
        while best is not None and lo < best[0] and self.left() > 0:
            mid = (lo + best[0]) // 2
            res = self.attempt(copies, mid)
            if res.found:
                best = (mid, res)
            else:
                lo = mid + 1
        return best

    def proven_below(self, ratio: Fraction, floor: Fraction) -> bool:
        """Every (copies, period) with floor <= period / copies < ratio was proven infeasible."""
        bad = {(p, t) for p, t, st in self.tried if st == "infeasible"}
        return all((p, t) in bad for p in range(1, MAX_COPIES + 1)
                   for t in range(math.ceil(floor * p), math.ceil(ratio * p)))


def find_repetend(problem: Problem, time_limit: float, workers: int | None = None,
                  progress: Progress | None = None, hint: Modulo | None = None) -> RepetendResult:
    """The repetend with the smallest period per micro-batch, and the shortest span at it.

    Periods below the device-load bound and below the memory bound (Little's law) are never
    tried; those are infeasible by argument."""
    run = _Search(problem, time_limit, workers, progress, hint)
    floor = max(Fraction(problem.period_bound), problem.memory_period_bound)
    found = run.smallest(1, math.ceil(floor), _largest_period(problem))
    if found is None:
        raise _no_period(problem, run)
    best = (1, *found)
    if Fraction(best[1]) > floor:
        best = _more_copies(run, floor, best, time.perf_counter() + run.left() * COPIES_SHARE)
    copies, T, res = best
    ratio = Fraction(T, copies)
    optimal = ratio == floor or run.proven_below(ratio, floor)
    return RepetendResult(modulo_of(res.values, problem, T, copies), res.status, optimal,
                          tuple(run.tried), time.perf_counter() - run.t0)


def _more_copies(run: _Search, floor: Fraction, best: tuple[int, int, SolveResult],
                 deadline: float) -> tuple[int, int, SolveResult]:
    """Patterns of 2..MAX_COPIES micro-batches, in order of period per micro-batch, until one
    beats the one-micro-batch repetend (each solve capped: a hard one is skipped, not waited on)."""
    ratio = Fraction(best[1], best[0])
    cands = sorted(((Fraction(t, p), p, t) for p in range(2, MAX_COPIES + 1)
                    for t in range(math.ceil(floor * p), math.ceil(ratio * p))), key=lambda x: (x[0], x[1]))
    for _, p, t in cands:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        res = solve_period(run.problem, t, min(left, COPY_SOLVE_SECONDS), run.workers, None, run.progress, p,
                           run.stall)
        run.tried.append((p, t, res.status))
        if res.found:
            return p, t, res
    return best


def _largest_period(problem: Problem) -> int:
    """A period at which micro-batches run one after another: any single-micro-batch
    schedule then fits, so a feasible repetend exists here whenever one micro-batch fits."""
    crit = int(bounds.paths(problem.units).critical_path)
    return max(problem.period_bound, crit + sum(problem.duration.values()))


def _no_period(problem: Problem, run: _Search) -> ValueError:
    tried = run.tried
    if tried and all(st == "infeasible" for _, _, st in tried) and tried[-1][1] >= _largest_period(problem):
        return ValueError(f"no schedule of {problem.placement.name!r} fits the memory limit "
                          f"{_fmt_list(problem.real_limit())}, not even with one micro-batch at a time: "
                          f"raise the limits")
    last = ", ".join(f"T={problem.real(t)}: {st}" for _, t, st in tried[-4:])
    return ValueError(f"no repetend found for {problem.placement.name!r} within "
                      f"{time.perf_counter() - run.t0:.1f}s ({last}); give a longer time limit")


def _fmt_list(xs: Any) -> str:
    return fmt(list(xs or ()), digits=6)
