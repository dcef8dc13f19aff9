"""Pass: the best schedule's per-device orders polished on the real durations (search/polish.py):
micro-batches in order per block, ready tasks pulled into the idle gaps the grid's completion left,
critical tasks moved earlier. It gets the clock left, at most half the time the search has spent
(0.5 s at least), and keeps its result only when shorter."""
from __future__ import annotations

import time

from ..budget import Clock
from ..polish import polish
from ..state import State


def orders(state: State, clock: Clock) -> None:
    s = state.best
    if s is None or state.objective != "makespan" or state.at_bound():
        return
    seconds = min(clock.left(), max(0.5, state.clock.elapsed() / 2))
    state.offer(polish(s, time.perf_counter() + seconds))
