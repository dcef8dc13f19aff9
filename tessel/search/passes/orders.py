"""Pass: the best schedule's per-device orders polished on the real durations (search/polish.py):
micro-batches in order per block, ready tasks pulled into the idle gaps the grid's completion left,
critical tasks moved earlier. Its budget is work, not time: tasks replayed, at least
Budget.order_least and more in proportion to the search's solver work (their deterministic
seconds; the wall-time budget it replaces was half the search's time), and a stall; so a loaded
machine gives the same schedule, and the clock's end is only a safety net. It keeps its result
only when shorter."""
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
