"""Pass (mode tessel): on a V placement, the V construction (search/vbuild.py) as a first answer
and a seed of the order polish.

The search alone (Budget.race off) has no hand-made V order to start from, and its repetends
complete 2-13% above ZB-V's with real costs and latency; the construction, built from the
placement's V alone, lands near it and the order polish (passes/orders.py) takes it further (it
polishes the best schedule, then the seeds). Only when the baselines are not raced: where they
are, ZB-V's hand-made order is among them (and polished when best), and a second build would
only take the clock from the search's own passes (as passes/vstart.py). A few dozen linear
walks, only when the clock holds them (State.affords).
"""
from __future__ import annotations

import logging

from ...schedule import Schedule, ScheduleError
from ..budget import Clock
from ..state import State
from ..vbuild import v_chain, v_construction

log = logging.getLogger(__name__)

BASE = "v construction"
BUILDS = 12.0  # linear builds (State.affords) the family's walks cost at most


def vbuild_seed(state: State, clock: Clock) -> None:
    """The shortest V construction offered as the best so far, and kept as a seed either way."""
    p, n = state.problem, state.micro_batches
    if state.budget.race or clock.expired() or v_chain(p.placement) is None or not state.affords(BUILDS):
        return
    starts = v_construction(p.placement, n, p.real_limit(), clock.deadline)
    if starts is None:
        return
    try:
        s = Schedule.build(p.placement, n, starts, p.real_limit(), None, {"base": BASE, "repetend": "none"})
    except ScheduleError as e:  # a rule the walk's times miss: no seed then
        log.info("V construction: %s", e)
        return
    state.statuses["v_construction"] = s.makespan
    state.offer(s)
    state.seeds.append(s)
