"""Mode `exact`: the whole N-micro-batch problem in one CP-SAT solve, the yardstick.

Every task is a variable; devices, dependencies and memory (a reservoir per device) as in the
completion models; the objective is the makespan with the lower bound of FORMAT.md as a floor,
so a solve that reaches the bound stops proven. Micro-batches are interchangeable, so a root
block's copies are ordered by micro-batch (any schedule can be relabelled that way), and in a
part of the graph that is a tree from one root, every block's are: where block b runs
micro-batch j before i although its input ran i first, swapping the labels i and j on b and
everything below it keeps every start time, hence devices and memory (memory depends only on
the times of a device's events), and keeps every dependency.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from .. import graph
from ..key import Key
from .budget import Clock, Stall
from .completion import add_tasks
from .problem import Problem
from .solver import Model, Progress, SolveResult


def solve_exact(problem: Problem, micro_batches: int, clock: Clock, workers: int | None,
                hint: Mapping[Key, int] | None = None, progress: Progress | None = None,
                stall: Stall | None = None) -> SolveResult:
    """Minimise the makespan within `clock` (building a large model takes seconds of it);
    `hint` (a valid schedule on the grid) bounds the horizon. With `stall`, a quick
    improvement of the hint rather than a proof."""
    t0 = time.perf_counter()
    if clock.expired():  # before the model: building it takes seconds at thousands of tasks
        return SolveResult("unknown", None, None, 0.0)
    n = micro_batches
    lb = problem.lower_bound(n)
    horizon = _horizon(problem, n, hint)
    m = Model()
    free = {(b, k): (0, horizon - problem.duration[b]) for k in range(n) for b in problem.block_ids}
    add_tasks(m, problem, free, {})
    for b in fifo_blocks(problem):
        for k in range(n - 1):
            m.precede(m.vars[(b, k)], m.vars[(b, k + 1)], 0)
    makespan = m.latest("makespan", lb, horizon, (m.vars[(b, k)] + problem.duration[b] for (b, k) in free))
    if hint:
        m.hints(_relabelled(hint, problem, n))
    m.minimize(makespan, lower=lb)
    if clock.expired():
        return SolveResult("unknown", None, None, time.perf_counter() - t0)
    return m.solve(clock, workers, progress, phase="exact", prove=stall is None, stall=stall,
                   report=lambda obj: {"makespan": problem.real(obj), "bound": problem.real(lb)})


def fifo_blocks(problem: Problem) -> list[str]:
    """Blocks whose micro-batches may be taken in order without losing any schedule: per
    connected part of the graph, its first root, and, where the part is a tree growing from a
    single root (one input per block), every block of it."""
    p = problem.units
    out: list[str] = []
    for part in _components(problem):
        roots = [b for b in part if not p.preds[b]]
        tree = len(roots) == 1 and all(len(p.preds[b]) <= 1 for b in part)
        out += part if tree else roots[:1]
    return out


def _components(problem: Problem) -> list[list[str]]:
    return graph.components(problem.block_ids, problem.units.edges)


def _horizon(problem: Problem, n: int, hint: Mapping[Key, int] | None) -> int:
    if hint:
        return max(s + problem.duration[b] for (b, _), s in hint.items()) - min(hint.values())
    return n * sum(problem.duration.values()) + sum(problem.gap(a, b) for a, b in problem.units.edges)


def _relabelled(hint: Mapping[Key, int], problem: Problem, n: int) -> dict[Key, int]:
    """The hint shifted to start at 0 and, per connected part, with micro-batches renumbered in
    the order its first root starts them (valid by the argument above); FIFO blocks of a tree
    part then follow where the hint is FIFO-consistent, else CP-SAT repairs the hint."""
    t0 = min(hint.values())
    out: dict[Key, int] = {}
    for part in _components(problem):
        root = next(b for b in part if not problem.units.preds[b])
        order = sorted(range(n), key=lambda k: (hint[(root, k)], k))
        out.update({(b, new): hint[(b, old)] - t0 for new, old in enumerate(order) for b in part})
    return out
