"""Pass: the best schedule's per-device orders polished on the real durations (search/polish.py):
micro-batches in order per block, ready tasks pulled into the idle gaps the grid's completion left,
critical tasks moved earlier, weight passes moved later. It polishes the search's own schedule, or
the best raced baseline when that one is shorter (a hand-made order leaves gaps under real costs
and latency too). Its budget is work, not time: tasks replayed, in proportion to the search's time
limit (Budget.order_budget: the limit given, not the time left, so a loaded machine gives the same
schedule), and a stall; the clock's end (Budget.orders_share of the limit is kept for it) is only
a safety net. It keeps its result only when shorter. The seeds other passes left (State.seeds: a
justified schedule that lost on the grid) are polished in turn, on what the budget has left."""
from __future__ import annotations

import time

from ..budget import Clock
from ..polish import Work, polish
from ..state import State


def orders(state: State, clock: Clock) -> None:
    s = state.best
    if s is None or state.objective != "makespan" or state.at_bound():
        return
    rival = min(state.rivals, key=state.value, default=None)
    if rival is not None and state.value(rival) < state.value(s):
        s = rival.with_meta(base=f"{rival.meta.get('method')}+polish")
    b = state.budget
    work = Work(b.order_budget(state.clock.limit), b.order_stall, clock.deadline, time.perf_counter)
    for seed in [s, *(x for x in state.seeds if x is not state.best)]:  # one budget shared, in turn
        out = polish(seed, work)
        if out is not seed or seed is not s:
            state.offer(out)
        if state.at_bound():
            break
