"""Forward-backward improvement (double justification) of a whole schedule, for mode fast.

At 32 devices and more the warm-up and cool-down of a constructed repetend span tens of
micro-batches, far more than a completion solve can free, and the plain unroll leaves devices
idle there: a device waits for its first backward with memory to spare for more forwards, and
at the end the weight passes are not kept back to fill the drain. Justification fixes both
without a solver, by list scheduling the whole problem twice:

- backward: the time-reversed problem (edges reversed, every allocation a release and every
  release an allocation, micro-batch m numbered N-1-m) is list scheduled with the tasks that
  end last first; read back, every task runs as late as the others allow, so the cool-down is
  packed (ZB-H2's deferred weight passes come out of this, found, not copied);
- forward: the problem itself, the tasks that start first in the backward result first: the
  warm-up is packed too.

The list scheduler is tessel.baselines.engine's (memory by reservation, so it never deadlocks
and never passes a limit) with releases given back as they end (Pools.release_early). The
rounds are a fixed budget of work (JUSTIFY_ROUNDS at most, stopping at the first round that
improves nothing), not a wall clock, so the same inputs give the same schedule on a loaded
machine. In the RCPSP literature: Valls, Ballestin and Quintanilla, EJOR 165 (2005).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from ..baselines.engine import Pools, list_schedule, memory_need, one_group
from ..key import Key
from ..placement import Number, Placement
from ..timing import DeadlockError
from .completion import makespan
from .problem import Problem

log = logging.getLogger(__name__)
JUSTIFY_ROUNDS = 4  # backward-forward rounds at most (each two walks of N x blocks tasks)
JUSTIFY_TASKS = 40_000  # justification runs up to this many tasks (N x blocks): a walk is linear in them
Starts = Mapping[Key, int]


def justified(problem: Problem, micro_batches: int, starts: Starts) -> dict[Key, int] | None:
    """The grid starts after justification rounds from `starts` (grid starts of all N
    micro-batches), when shorter than `starts`; None when not, or when the walk cannot run
    (too many tasks, or a limit below one micro-batch's reservation)."""
    n, units = micro_batches, problem.units
    pools = _pools(units, problem, n)
    if pools is None or n * len(units.blocks) > JUSTIFY_TASKS or not _balanced(units):
        return None
    back = reversed_placement(units)
    back_pools = _pools(back, problem, n)
    if back_pools is None:
        return None
    best, first = dict(starts), makespan(problem, starts)
    for _ in range(JUSTIFY_ROUNDS):
        try:
            late = _backward(problem, back, back_pools, n, best)
            early = _forward(problem, pools, n, late)
        except DeadlockError as e:  # the reservation rule makes this a bug; keep what we have
            log.warning("justification stopped: %s", e)
            break
        top = min((early, late), key=lambda st: makespan(problem, st))
        if makespan(problem, top) >= makespan(problem, best):
            break
        best = top
    if makespan(problem, best) >= first:
        return None
    log.info("justification: makespan %d -> %d (grid)", first, makespan(problem, best))
    return best


def reversed_placement(p: Placement) -> Placement:
    """The same blocks in reversed time: edges reversed, memory negated (an allocation at a
    start becomes a release at an end read backwards). Latency is symmetric."""
    blocks = tuple(replace(b, memory=-b.memory) for b in p.blocks)
    return Placement(f"{p.name}-reversed", p.devices, blocks, tuple((b, a) for a, b in p.edges), p.latency)


def _balanced(p: Placement) -> bool:
    """Every device frees what one micro-batch allocates on it: then the reversed problem starts
    from empty memory too, and its walk's limits are the real ones."""
    return all(sum(b.memory for b in p.blocks_on(d)) == 0 for d in range(p.devices))


def _pools(p: Placement, problem: Problem, n: int) -> Pools | None:
    """One pool per device capped at its limit, releases given back early; None when a pool
    cannot let one micro-batch through (its reservation is over the limit)."""
    group = one_group(p)
    if problem.limit is None:
        return Pools(group, {}, release_early=True)
    caps: dict[tuple[int, object], Number] = {}
    for (d, g), need in memory_need(p, n, group).items():
        if need > problem.limit[d]:
            return None
        caps[(d, g)] = problem.limit[d]
    return Pools(group, caps, release_early=True)


def _rank(p: Placement) -> dict[str, int]:
    return {b: i for i, b in enumerate(p.topo_order)}


def _backward(problem: Problem, back: Placement, pools: Pools, n: int, starts: Starts) -> dict[Key, int]:
    """Every task as late as the others allow: the reversed problem, latest end first."""
    dur, rank = problem.duration, _rank(back)
    end = {key: s + dur[key[0]] for key, s in starts.items()}
    horizon = max(end.values())
    out = list_schedule(back, n, lambda b, m: (horizon - end[(b, n - 1 - m)], m, rank[b]), pools)
    last = max(int(v) + dur[b] for (b, _), v in out.items())
    return {(b, n - 1 - m): last - (int(v) + dur[b]) for (b, m), v in out.items()}


def _forward(problem: Problem, pools: Pools, n: int, starts: Starts) -> dict[Key, int]:
    """Every task as early as the others allow, earliest start first."""
    rank = _rank(problem.units)
    out = list_schedule(problem.units, n, lambda b, m: (starts[(b, m)], m, rank[b]), pools)
    return {key: int(v) for key, v in out.items()}
