"""Pass (mode tessel): on a V placement under a tight memory limit, the v-mem construction
(tessel.baselines.vmem) as the search's own start: its steady state as the period search's
repetend, and its schedule as a first answer.

The period search starts from the smallest construction that fits memory, or a repetend read
off its list schedule (start.py). On `zbv` with a limit below ZB-V's (V-Half's and V-Min's
memory, profiled costs) neither is near the load bound, and the period search cannot decide the
periods between them and the bound in seconds (p = 6, V-Half's memory, 5 s: the search alone
7% above V-Half). The v-mem family keeps a V's activations as few as the limit asks by
construction and repeats every micro-batch at or near the load bound, so:

- its middle micro-batches are a repetend (justify.best_window: devices and memory checked) that
  replaces state.start when its period per micro-batch is smaller (or the same, span shorter);
- its orders replayed on the grid placement are a seed (State.seeds, base `v-mem
  construction`): offered after the completion (justify_both, else `vmem_seed` at the end of
  the passes), polished on the real durations (passes/orders.py) when it loses there.

Only when the baselines are not raced (Budget.race off): where they are, v-mem is one of them
(not futile exactly where this pass would build it), its schedule is in hand and polished when
best (passes/orders.py), and a second build here only takes the clock from the search's own
passes (p = 8, V-Min's memory, 24 micro-batches, 5 s on a loaded machine: 84.6 where they reach
84.1 without it). Only where v-mem is not futile (vmem_futile: ZB-V's hand order
does not fit the limit), so the other placements never pay for it: one build of the family
(0.3-2 s at p = 4-8); its repetend read off from READ micro-batches on.
"""
from __future__ import annotations

import logging

from ...baselines import BASELINES, BaselineError, futile, why_not
from ...baselines.deadline import until
from ...key import Key
from ...schedule import ScheduleError
from ...timing import earliest_starts, orders_from_starts
from ..budget import Clock
from ..justify import best_window
from ..state import State
from .complete import with_kernel

log = logging.getLogger(__name__)

METHOD = "v-mem"
BASE = "v-mem construction"
READ = 12  # micro-batches the read-off needs at least: a middle third (4) that holds the steady state


def vmem_start(state: State, clock: Clock) -> None:
    """The v-mem construction as the search's start and first schedule (module doc)."""
    p, start, n = state.problem, state.start, state.micro_batches
    if start is None or clock.expired() or state.budget.race:
        return  # raced: v-mem is among the baselines (raced before or after), the clock is better spent on our own
    starts = _built(state, n, clock.deadline)
    if starts is None:
        return
    mod = best_window(p, n, starts) if n >= READ else None
    if mod is not None and (mod.per_micro_batch, mod.span(p)) < (start.per_micro_batch, start.span(p)):
        state.start = mod
        state.statuses["vmem_start"] = [p.real(mod.period), mod.copies, p.real(mod.span(p))]
    kernels = [(mod.period, mod.copies)] if mod is not None else []
    try:
        seed = with_kernel(p, n, starts, kernels, BASE) or with_kernel(p, n, starts, [], BASE)
    except ScheduleError as e:  # the grid's rounding may take the orders over a rule: no seed then
        log.info("v-mem seed: %s", e)
        return
    if seed is not None:
        state.seeds.append(seed)


def _built(state: State, n: int, deadline: float) -> dict[Key, int] | None:
    """v-mem's orders of `n` micro-batches, built on the real placement (its walk places the W
    passes on the real durations and latencies, where the grid's rounding would move them) and
    replayed as early as they allow on the grid; None where v-mem does not apply, is futile,
    does not fit the clock or finds nothing under the limit. Stopped at the time.perf_counter()
    `deadline` (p = 16, V-Half's memory: 5 CPU s a build, 20-30 s of wall time on 2 cores at
    load 12, past a 20 s search's clock), with the best timed by then."""
    p = state.problem
    real, limit = p.placement, p.real_limit()
    if why_not(METHOD, real) is not None or futile(METHOD, real, n, limit) is not None:
        return None
    if not state.affords(state.budget.own_builds, n):
        return None
    try:
        with until(deadline):  # never past the search's clock: v-mem's best by then (anytime)
            s = BASELINES[METHOD](real, n, limit)
    except (BaselineError, ScheduleError) as e:
        log.info("v-mem start: %s", e)
        return None
    grid = earliest_starts(p.units, n, orders_from_starts(real, s.start))
    return {key: int(v) for key, v in grid.items()}


def vmem_seed(state: State, clock: Clock) -> None:
    """After the passes of mode tessel: the v-mem seed offered if it is still a seed (justify_both
    offers the seeds only when the clock holds a completion's builds; a loaded machine may leave
    it none, and the seed was already paid for)."""
    for s in [x for x in state.seeds if x.meta.get("base") == BASE]:
        if state.offer(s):
            state.seeds.remove(s)
