"""The one state every pass of a search reads and improves (passes/): the problem and the
clock, the best schedule so far and the repetend it completes, the raced baselines, the
bounds proven on the way, and what the report will say (statuses and seconds by phase)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .. import bounds
from ..numeric import EPS, rounded
from ..placement import Number
from ..schedule import Schedule
from . import relax
from .budget import Budget, Clock
from .modulo import Modulo
from .problem import Problem
from .repetend import RepetendResult
from .solver import Progress


@dataclass
class State:
    problem: Problem
    micro_batches: int
    clock: Clock
    workers: int
    progress: Progress | None
    budget: Budget
    objective: str = "makespan"
    rivals: list[Schedule] = field(default_factory=list)  # the raced baselines on the real placement
    raced: bool = False  # whether the race ran (it runs once, when the search's own schedule needs it)
    start: Modulo | None = None  # a repetend that fits memory, before any period search
    repetend: RepetendResult | None = None  # the period search's (or fast's construction's) result
    modulo: Modulo | None = None  # the repetend `best` completes
    best: Schedule | None = None  # the best schedule so far
    # schedules the order polish starts from too (passes/orders.py): a justified one that lost to the
    # best on the grid may polish shorter on the real durations
    seeds: list[Schedule] = field(default_factory=list)
    # a looped placement's grouped repetend and its unroll, one of the seeds (passes/rounds.py)
    grouped: tuple[Schedule, Modulo] | None = None
    statuses: dict[str, Any] = field(default_factory=dict)  # of every solve, by phase
    seconds: dict[str, float] = field(default_factory=dict)  # by phase
    solver_bound: int | None = None  # grid units: a bound on the makespan proven by a solve
    per_task: float | None = None  # seconds per task a linear build took here (race.py), once measured
    _bound: tuple[Number, str] | None = None  # the arguments' bound (bounds.proven_lower_bound), once
    _relaxed: bool = False  # the one-device relaxation has run (--prove only)

    def report(self, **update: Any) -> None:
        if self.progress:
            self.progress({**update, "elapsed": round(self.clock.elapsed(), 3)})

    def lap(self, phase: str, since: float) -> None:
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + time.perf_counter() - since, 3)

    def value(self, s: Schedule) -> Number:
        return objective_value(s, self.objective)

    def offer(self, s: Schedule | None) -> bool:
        """Keep `s` when it beats the best so far (by the objective); whether it did."""
        if s is None or (self.best is not None and self.value(s) >= self.value(self.best) - EPS):
            return False
        self.best = s
        return True

    def note_bound(self, status: str, bound: int | None) -> None:
        """A makespan bound a solve proved on the grid; it holds for the real durations only
        when the grid is exact (a rounded-up grid proves bounds of longer blocks)."""
        if bound is not None and status in ("optimal", "feasible") and self.problem.exact_time \
                and self.objective == "makespan":
            self.solver_bound = max(self.solver_bound or 0, bound)

    def lower_bound(self) -> tuple[Number, str]:
        """The best proven lower bound of the objective, and which argument proved it."""
        if self._bound is None:
            self._bound = self.bound_at(self.micro_batches)
        self._relax(self._bound)
        if self.solver_bound is not None and self.problem.real(self.solver_bound) > self._bound[0] + EPS:
            return self.problem.real(self.solver_bound), "solver"
        return self._bound

    def _relax(self, bound: tuple[Number, str]) -> None:
        """Asked to prove (Budget.prove), once a schedule is in hand above the arguments'
        bound: the one-device relaxations (relax.relaxed_bound, a deterministic budget), then,
        still above, those of several devices at once (relax.group_bound), that schedule's
        makespan their horizon. Not by default: their work costs seconds to minutes."""
        value = self.best_value()
        if self._relaxed or not self.budget.prove or self.objective != "makespan" or value is None \
                or value <= bound[0] + EPS:
            return
        self._relaxed = True
        t0 = time.perf_counter()
        x = relax.relaxed_bound(self.problem, self.micro_batches, value, bound[0])
        if value > x + EPS:  # then several devices at once: their interaction under memory (relax.group_bound)
            x = relax.group_bound(self.problem, self.micro_batches, value, x, clock=self.clock)
        self.lap("relaxation", t0)
        if x > bound[0] + EPS:
            self._bound = (x, "relaxation")

    def prove(self, bound: Number, source: str) -> None:
        """A lower bound of the makespan proven on the way (a relaxation's refuted horizons)."""
        if self.objective == "makespan" and bound > self.lower_bound()[0] + EPS:
            self._bound = (bound, source)

    def bound_at(self, micro_batches: int) -> tuple[Number, str]:
        """The arguments' bound (not the solver's) for that many micro-batches."""
        p = self.problem
        limit = p.real_limit()
        memory = []
        for d in p.limited_devices() if limit is not None else []:
            pairs = p.memory_pairs(d)
            if pairs and limit is not None:
                memory.append((d, [(a, r, amount / p.memory_scale) for a, r, amount in pairs], limit[d]))
        device = p.device_bound(micro_batches) if self.objective == "makespan" else None
        return bounds.proven_lower_bound(p.placement, micro_batches, memory, None, self.objective, device)

    def grid_bound(self, micro_batches: int) -> int:
        """A completion of that many micro-batches on the grid whose makespan is at most this
        cannot be improved: the grid's own bound, or the real one met (makespan only)."""
        p = self.problem
        grid = p.lower_bound(micro_batches)
        if self.objective != "makespan":
            return grid
        real = self.bound_at(micro_batches)[0] if micro_batches != self.micro_batches else self.lower_bound()[0]
        return max(grid, math.floor(float(real) / float(p.resolution) + 1e-9))

    def best_value(self, rivals: bool = True) -> Number | None:
        """The objective of the best schedule so far, the raced baselines' included or not."""
        values = [self.value(s) for s in [*([self.best] if self.best else []), *(self.rivals if rivals else [])]]
        return min(values) if values else None

    def affords(self, builds: float, micro_batches: int | None = None) -> bool:
        """Whether the clock left holds `builds` linear passes over the tasks of that many
        micro-batches (default N): building, compacting or checking a schedule. Up to
        Budget.gated_tasks tasks, and for passes of under Budget.free_build seconds, always
        (they overrun little, and the search's results there never depend on the machine's load)."""
        tasks = (micro_batches or self.micro_batches) * len(self.problem.block_ids)
        if tasks <= self.budget.gated_tasks:
            return True
        need = builds * tasks * (self.per_task or self.budget.baseline_per_task)
        return need <= self.budget.free_build or need <= self.clock.left()

    def answered(self) -> bool:
        """A raced baseline meets the best proven bound and the clock cannot hold the search's
        own schedule (Budget.own_builds builds): the search answers with the baseline now."""
        return self.at_bound(True) and not self.affords(self.budget.own_builds)

    def at_bound(self, rivals: bool = True, gap: float = 0.0) -> bool:
        """The best schedule so far (with `rivals`, a raced baseline's too) meets the best
        proven bound (within `gap` of it): no pass can improve it, so the search answers now."""
        v = self.best_value(rivals)
        return v is not None and v <= self.lower_bound()[0] * (1 + gap) + EPS


def objective_value(s: Schedule, objective: str = "makespan") -> Number:
    """The makespan, or the span: the longest time from a device's first start to its last end
    (the iteration time when iterations overlap)."""
    if objective == "makespan":
        return s.makespan
    spans = [orders[-1].start + s.placement.by_id[orders[-1].block].duration - orders[0].start
             for orders in s.device_orders() if orders]
    return max(spans)


def per_micro_batch(p: Problem, mod: Modulo) -> Number:
    """A repetend's period per micro-batch in real time."""
    return rounded(p.real(mod.period) / mod.copies, 6)
