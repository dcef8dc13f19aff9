"""Search: the schedule of a placement for N micro-batches under memory limits.

`search(placement, micro_batches, memory=None, mode="tessel", time_limit=None, workers=None,
progress=None) -> Schedule`; modes `tessel` (default), `fast` and `exact` (see pipeline.py).
"""
from .pipeline import MODES, search
from .problem import MemoryLimitError

__all__ = ["MODES", "MemoryLimitError", "search"]
