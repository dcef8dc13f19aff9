"""Pass: the best schedule's per-device orders polished on the real durations (search/polish.py):
micro-batches in order per block, ready tasks pulled into the idle gaps the grid's completion left,
critical tasks moved earlier. Its budget is work, not time: tasks replayed, about half the work
of the search's solves (Budget.order_budget, their deterministic seconds) and a stall, so a loaded
machine gives the same schedule; the clock's end is only a safety net. It keeps its result only
when shorter."""
from __future__ import annotations

from ..budget import Clock
from ..polish import polish
from ..state import State


def orders(state: State, clock: Clock) -> None:
    s = state.best
    if s is None or state.objective != "makespan" or state.at_bound():
        return
    b = state.budget
    state.offer(polish(s, b.order_budget(state.solver_work()), b.order_stall, clock.deadline))
