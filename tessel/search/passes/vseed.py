"""Pass (mode tessel): on a V placement, the V construction (search/vbuild.py), on a line placement
the line construction (search/linebuild.py), as a first answer and a seed of the order polish.

The search alone (Budget.race off) has no hand-made V order to start from, and its repetends
complete 2-13% above ZB-V's with real costs and latency; the construction, built from the
placement's V alone, lands near it and the order polish (passes/orders.py) takes it further (it
polishes the best schedule, then the seeds). Raced too (the default), it races as the baselines do
(a rival, as a warm start: the completion replaces the search's own first answer, and the raced
baselines seed the polish there): one of its variants (warm-up and
chunk-0 lag one step up) is shorter than every raced baseline under 1F1B's memory on zbv, p = 16,
unit costs, latency 0.5 (m = 48: 187 where DualPipeV takes 188; the default answered 188, the
search alone 187), and the whole family takes 0.5-0.7 s at p = 16, m = 48-64 on 2 loaded cores.
Some thirty linear walks, only when the clock holds them (State.affords); run even when the
CP-SAT import took the passes' clock (FREE_WORK). The line construction does the same for the line's own shape (1F1B's
orders, the W passes held back by the walk): 3 variants, 3 walks each.
"""
from __future__ import annotations

import logging
import math

from ...schedule import ScheduleError
from ...timing import orders_from_starts, schedule_from_orders
from ..budget import Clock
from ..linebuild import line_chain, line_construction
from ..state import State
from ..vbuild import v_chain, v_construction

log = logging.getLogger(__name__)

BASE = "v construction"
LINE_BASE = "line construction"
BUILDS = 32.0  # linear builds (State.affords) the family costs at most: 8 variants, a replay and 3 walks each
# devices x tasks up to which the whole family is built whatever the clock says (8 devices, 32
# micro-batches: 12,288, 1 s at load 11): the same schedule on a loaded machine, and not gated on the
# clock the CP-SAT import took (a 3 s search at load 11: the passes' clock spent before they start).
# Above it the variants after the first stop at the clock's end (16 devices, 64 micro-batches: 4 s).
FREE_WORK = 20_000


def vbuild_seed(state: State, clock: Clock) -> None:
    """The shortest V (or line) construction: raced with the baselines, or, where none is raced,
    offered as the best so far and kept as a seed."""
    p, n = state.problem, state.micro_batches
    if not state.affords(BUILDS):
        return
    if v_chain(p.placement) is not None:
        build, base = v_construction, BASE
    elif line_chain(p.placement) is not None:
        build, base = line_construction, LINE_BASE
    else:
        return
    free = p.units.devices * n * len(p.block_ids) <= FREE_WORK
    starts = build(p.placement, n, p.real_limit(), math.inf if free else clock.deadline)
    if starts is None:
        return
    try:
        # its orders replayed as early as they allow: no later than the walk's times (the same peaks: an
        # order's) and without the walk's float dust, which left a line 2e-9 above a bound it meets
        s = schedule_from_orders(p.placement, n, orders_from_starts(p.placement, starts), p.real_limit(), None,
                                 {"base": base, "method": base, "repetend": "none"})
    except ScheduleError as e:  # a rule the walk's times miss: no seed then
        log.info("%s: %s", base, e)
        return
    state.statuses[base.replace(" ", "_")] = s.makespan
    if state.budget.race:
        state.rivals.append(s)
    else:
        state.offer(s)
        state.seeds.append(s)
