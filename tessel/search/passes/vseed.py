"""Pass (mode tessel): on a V placement, the V construction (search/vbuild.py), on a line placement
the line construction (search/linebuild.py), as a first answer and a seed of the order polish.

The search alone (Budget.race off) has no hand-made V order to start from, and its repetends
complete 2-13% above ZB-V's with real costs and latency; the construction, built from the
placement's V alone, lands near it and the order polish (passes/orders.py) takes it further (it
polishes the best schedule, then the seeds). Only when the baselines are not raced: where they
are, ZB-V's hand-made order is among them (and polished when best), and a second build would
only take the clock from the search's own passes (as passes/vstart.py). Some thirty linear
walks, only when the clock holds them (State.affords); run even when the CP-SAT import took the
passes' clock (FREE_WORK). The line construction does the same for the line's own shape (1F1B's
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
    """The shortest V (or line) construction offered as the best so far, and kept as a seed either way."""
    p, n = state.problem, state.micro_batches
    if state.budget.race or not state.affords(BUILDS):
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
                                 {"base": base, "repetend": "none"})
    except ScheduleError as e:  # a rule the walk's times miss: no seed then
        log.info("%s: %s", base, e)
        return
    state.statuses[base.replace(" ", "_")] = s.makespan
    state.offer(s)
    state.seeds.append(s)
