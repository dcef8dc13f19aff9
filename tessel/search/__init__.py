"""Search: the schedule of a placement for N micro-batches under memory limits.

`search(placement, micro_batches, memory=None, mode="tessel", time_limit=None, workers=None,
progress=None) -> Schedule`; modes `tessel` (default), `fast` and `exact` (see orchestrate.py).
"""
from .budget import Budget
from .orchestrate import MODES, OBJECTIVES, search
from .problem import MemoryLimitError
from .report import SearchReport

__all__ = ["MODES", "OBJECTIVES", "Budget", "MemoryLimitError", "SearchReport", "search"]
