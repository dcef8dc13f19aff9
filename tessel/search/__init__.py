"""Search: the schedule of a placement for N micro-batches under memory limits.

`search(placement, micro_batches, memory=None, mode="tessel", time_limit=None, workers=None,
progress=None, objective="makespan", starts=()) -> Schedule`; modes `tessel` (default), `fast` and `exact`
(see orchestrate.py). CP-SAT (with numpy and pandas) takes seconds to import, so it is loaded
by the first model a search solves (solver.py), on that search's clock: the time limit covers it,
and a search a raced baseline answers (4,096 devices) never loads it.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .budget import MODES, OBJECTIVES, Budget, Clock, command_clock
from .problem import MemoryLimitError
from .report import SearchReport

if TYPE_CHECKING:
    from ..placement import Number, Placement
    from ..schedule import Schedule

__all__ = ["MODES", "OBJECTIVES", "Budget", "Clock", "MemoryLimitError", "SearchReport", "command_clock", "search"]


def search(placement: Placement, micro_batches: int, memory: Number | Sequence[Number] | None = None,
           mode: str = "tessel", time_limit: float | None = None, workers: int | None = None,
           progress: Any = None, objective: str = "makespan", started: float | None = None,
           budget: Budget | None = None, clock: Clock | None = None,
           starts: Sequence[Schedule] | Mapping[str, Schedule] = ()) -> Schedule:
    """See orchestrate.search; `clock` is the command's wall clock (command_clock), else
    `time_limit` counts from `started` (a time.perf_counter() value, default now); `budget` how
    the passes share it (default Budget()); `starts` schedules to start from (warm.py)."""
    started = time.perf_counter() if started is None else started
    from .orchestrate import search as run
    return run(placement, micro_batches, memory, mode, time_limit, workers, progress, objective, started, budget,
               clock, starts)
