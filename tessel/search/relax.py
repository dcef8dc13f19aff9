"""A lower bound from a small exact relaxation: one device at a time, solved by CP-SAT.

The relaxation of device d keeps every task on d and, of the rest of the problem, only what
bounds.device_lower_bound already proves about it; it drops the other devices' capacity:
- each task (b, k) of a block b on d starts at or after the least start of the k-th task of b
  in time order (bounds.staggered_releases) and leaves at least the tail of the (N-1-k)-th
  last (bounds.staggered_tails) before the makespan. Micro-batches are interchangeable, so on
  the blocks where taking them in order loses no schedule (exact.fifo_blocks: a tree part of the
  graph) the k-th task in time order is micro-batch k's; on the others every task gets the
  block's least release and least tail;
- two tasks of one micro-batch on d keep the longest path between them, latencies included,
  as a least delay from start to start (rule 2 along the path);
- d runs one task at a time (rule 3), and its memory events are all kept (rule 4: allocations
  at starts, releases at ends, one reservoir; events at one time count together, which only
  lets more through).
An optimal schedule, its micro-batches relabelled as above, restricted to d, is a schedule of
the relaxation of the same makespan, so the relaxation's optimum, and any bound CP-SAT proves
on it, is a lower bound. Times go onto a grid rounded *down* (starts, durations, delays,
releases and tails: floor(x + y) >= floor(x) + floor(y) keeps every constraint of the image of a
real schedule), so the grid bound stays below the real optimum.

Unlike the preemptive one-machine bound of bounds.device_lower_bound, it sees that a task
waits for its own micro-batch's earlier task and that memory caps the micro-batches in flight
at once: on a V (zbv) the device at the tip can start only so many micro-batches before the
first one's round trip returns, so it idles at the start, and again at the end, where the last
ones' round trips leave nothing to run. On zbv with 16 devices, 24 micro-batches, unit costs,
latency 0.5 and 1F1B's memory it proves 116.5 where the arguments prove 103; the best known
schedule (the zero-bubble repository's) is 116.5.

CP-SAT's work on it is capped in deterministic seconds (one worker: the same bound every run);
a device with more than RELAX_TASKS tasks is left out (the reservoir grows with the square of
its events).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from .. import bounds
from ..numeric import EPS, snap
from ..placement import Number, Placement
from .exact import fifo_blocks
from .problem import Problem

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

log = logging.getLogger(__name__)

RELAX_TASKS = 300  # most tasks of one device the relaxation models
RELAX_WORK = 0.5  # deterministic seconds of CP-SAT's work per solve
RELAX_PROBES = 4  # solves per device, each below a lower horizon
RELAX_UNITS = 20_000  # most time steps below the horizon
GRID_EPS = 1e-9  # a value within this many grid steps of a grid point counts as on it (float dust)


def relaxed_bound(problem: Problem, micro_batches: int, upper: Number, floor: Number = 0,
                  work: float = RELAX_WORK, devices: int | None = None) -> Number:
    """The best lower bound of the makespan that the one-device relaxations prove (module doc),
    at least `floor` (a proven bound); `upper` is the makespan of a valid schedule: the proof
    stops there and its horizons start below it (the bound holds whatever `upper` says: it only
    rises by proofs). At most `devices` devices are tried, those whose preemptive bound is highest
    first (then those that start latest); each gets RELAX_PROBES solves of `work` deterministic
    seconds at most (_probes)."""
    p, n = problem.placement, micro_batches
    if n * sum(len(b.devices) for b in p.blocks) > bounds.STAGGER_TASKS or \
            all(n * len(p.blocks_on(d)) > RELAX_TASKS for d in range(p.devices)):
        return floor
    memory = problem.real_holds()
    rows = (bounds.staggered_releases(p, n, memory, bounds.RELAX_TERM_WORK),
            bounds.staggered_tails(p, n, memory, bounds.RELAX_TERM_WORK))
    fifo = set(fifo_blocks(problem))
    res = grid(p, upper)
    best = floor
    for d in _order(p, n, rows, memory)[:devices]:
        if best >= upper - EPS:
            break
        units = _probes(problem, res, n, d, rows, fifo, _down(best, res), _down(upper, res), work)
        best = max(best, snap(units * res))
    return best


def grid(p: Placement, upper: Number) -> float:
    """The relaxation's time step: the largest that divides every duration and the latency
    (as fractions of denominator up to 10**6: 0.004 for 0.5, 0.488, 0.252 and 0.032), unless
    the horizon would take more than RELAX_UNITS of it; then the horizon / RELAX_UNITS, the
    durations rounded down to it (still a relaxation, a little weaker). Few units keep the
    solves short: the search's binary grid of the same durations (2**-11) stalled them."""
    values = [Fraction(v).limit_denominator(10**6) for v in [b.duration for b in p.blocks] + [p.latency] if v]
    step = Fraction(math.gcd(*(v.numerator for v in values)), math.lcm(*(v.denominator for v in values)))
    return max(float(step), float(upper) / RELAX_UNITS)


def _order(p: Placement, n: int, rows: tuple[bounds.Rows, bounds.Rows], memory: bounds.Memory) -> list[int]:
    """The devices small enough to model, highest preemptive bound first, then those whose first
    release is furthest from the middle of all devices' (the ends of the pipeline: the tip of a V,
    whose round trips split its work, and the first device of a loop, whose last backward comes
    back through all the others), the later first: only the order in which the budget is spent
    (every device's relaxation is a bound)."""
    pre = bounds.device_bounds(p, n, memory, rows, ramp=False)  # the one-machine bound: where a device's tasks crowd
    small = [d for d in pre if n * len(p.blocks_on(d)) <= RELAX_TASKS]
    first = {d: min(float(rows[0][b.id][0]) for b in p.blocks_on(d)) for d in small}
    mid = (max(first.values(), default=0.0) + min(first.values(), default=0.0)) / 2
    return sorted(small, key=lambda d: (-pre[d], -abs(first[d] - mid), -first[d], d))


def _down(x: Number, res: float) -> int:
    return math.floor(float(x) / res + GRID_EPS)


def _probes(problem: Problem, res: float, n: int, d: int, rq: tuple[bounds.Rows, bounds.Rows], fifo: set[str],
            lo: int, hi: int, work: float) -> int:
    """The bound device d's relaxation proves, in grid units, between `lo` (proven) and `hi`
    (a relaxed schedule of that makespan exists: the image of a valid one). Each probe solves
    the relaxation below a horizon h: with nothing below h, h + 1 is proven; otherwise the
    solve's own bound holds and its schedule lowers hi. A probe goes just below hi after a
    schedule is found (one infeasibility proves it optimal), else halfway."""
    just_below = True  # a schedule was just found: is it the relaxation's optimum?
    for _ in range(RELAX_PROBES):
        if lo >= hi:
            break
        h = hi - 1 if just_below else (lo + hi) // 2
        status, bound, found = _solve(problem, res, n, d, rq, fifo, h, lo, work)
        log.info("relaxation of device %d below %d: %s, bound %d", d, h, status, bound)
        lo = max(lo, bound)  # h + 1 where nothing fits below h
        if found is not None:
            hi, just_below = found, True
        elif status == "INFEASIBLE" or just_below:
            just_below = False
        else:  # neither a schedule nor a proof halfway: give up on this device
            break
    return lo


def _solve(problem: Problem, res: float, n: int, d: int, rq: tuple[bounds.Rows, bounds.Rows], fifo: set[str],
           horizon: int, floor: int, work: float) -> tuple[str, int, int | None]:
    """Device d's relaxation with every task ending by `horizon` (grid units), its makespan
    at least `floor`: CP-SAT's status, its proven bound and the makespan it found (or None)."""
    from ortools.sat.python import cp_model  # seconds to import: only a search asked to prove comes here
    p = problem.placement
    r, q = rq
    m = cp_model.CpModel()
    makespan = m.new_int_var(floor, horizon, "makespan")
    start: dict[tuple[str, int], cp_model.IntVar] = {}
    busy = []
    for b in p.blocks_on(d):
        dur = _down(b.duration, res)
        for k in range(n):
            own = k if b.id in fifo else 0  # the k-th in time order is micro-batch k's
            lo, tail = _down(r[b.id][own], res), _down(q[b.id][n - 1 - own if b.id in fifo else 0], res)
            if lo > horizon - dur - tail:  # this task alone cannot end by the horizon
                return "INFEASIBLE", horizon + 1, None
            s = start[(b.id, k)] = m.new_int_var(lo, horizon - dur - tail, f"{b.id}_{k}")
            busy.append(m.new_fixed_size_interval_var(s, dur, f"on_{b.id}_{k}"))
            m.add(makespan >= s + dur + tail)
            if k and b.id in fifo:
                m.add(s >= start[(b.id, k - 1)] + dur)
    m.add_no_overlap(busy)
    for (x, y), gap in _delays(p, d).items():
        for k in range(n):
            m.add(start[(y, k)] >= start[(x, k)] + _down(gap, res))
    _reservoir(m, problem, res, d, n, start)
    m.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 1
    solver.parameters.max_deterministic_time = work
    # the presolve expands the reservoir into an ordering per pair of events, and spends the
    # whole budget doing it; the search proves these bounds without it
    solver.parameters.cp_model_presolve = False
    solver.parameters.catch_sigint_signal = False
    code = solver.solve(m)
    status = solver.status_name(code)
    if code == cp_model.INFEASIBLE:
        return status, horizon + 1, None
    found = round(solver.objective_value) if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    return status, max(floor, math.floor(solver.best_objective_bound + GRID_EPS)), found


def _reservoir(m: cp_model.CpModel, problem: Problem, res: float, d: int, n: int,
               start: Mapping[tuple[str, int], cp_model.IntVar]) -> None:
    """Rule 4 on device d, every event of every micro-batch (memory units of the problem). Each
    allocation goes next to its micro-batch's release where the memory pairs up (memory_pairs):
    the same constraint, but CP-SAT proved the V's bounds with these in a fraction of the work."""
    if problem.limit is None:
        return

    def end(b: str, k: int) -> cp_model.LinearExprT:
        return start[(b, k)] + _down(problem.placement.by_id[b].duration, res)
    pairs = problem.memory_pairs(d)
    events: list[tuple[cp_model.LinearExprT, int]] = []
    if pairs is not None:
        events = [e for a, r, x in pairs for k in range(n) for e in ((start[(a, k)], x), (end(r, k), -x))]
    else:  # allocations at starts, releases at ends
        events = [(start[(b.id, k)] if x > 0 else end(b.id, k), x) for b in problem.placement.blocks_on(d)
                  if (x := problem.memory[b.id]) for k in range(n)]
    if events:
        low = -sum(abs(x) for _, x in events) - 1
        m.add_reservoir_constraint([t for t, _ in events], [x for _, x in events], low, problem.cap(d))


def _delays(p: Placement, d: int) -> dict[tuple[str, str], Number]:
    """Least time from the start of a to the start of b, both on device d, one micro-batch:
    the longest path, durations and latencies along it."""
    on = [b.id for b in p.blocks_on(d)]
    out: dict[tuple[str, str], Number] = {}
    for a in on:
        dist: dict[str, Number] = {a: 0}
        for x in p.topo_order:
            if x in dist:
                for y in p.succs[x]:
                    dist[y] = max(dist.get(y, 0), dist[x] + p.by_id[x].duration + p.edge_latency(x, y))
        out.update({(a, b): dist[b] for b in on if b != a and b in dist})
    return out

