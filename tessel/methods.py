"""One registry of every scheduling method: the baselines and the search modes.

`run_method(name, placement, micro_batches, memory_limit, **opts)` returns a validated Schedule.
Baselines ignore the search options (time_limit, workers, progress). The search modes come from
`tessel.search` (OR-Tools is a dependency, not an option), imported only when one runs.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .baselines import BASELINES, why_not
from .errors import UsageError
from .placement import Placement
from .schedule import Schedule
from .search.budget import MODES

log = logging.getLogger(__name__)
Method = Callable[..., Schedule]
SEARCH_MODES = MODES


def _baseline(name: str) -> Method:
    def run(placement: Placement, micro_batches: int, memory_limit: Any = None, **opts: Any) -> Schedule:
        return BASELINES[name](placement, micro_batches, memory_limit)
    return run


def _search(mode: str) -> Method:
    def run(placement: Placement, micro_batches: int, memory_limit: Any = None, **opts: Any) -> Schedule:
        from .search import search
        return search(placement, micro_batches, memory=memory_limit, mode=mode, **opts)
    return run


METHODS: dict[str, Method] = {**{m: _search(m) for m in SEARCH_MODES},
                              **{b: _baseline(b) for b in BASELINES}}


def available_methods() -> list[str]:
    """Every method: the search modes first, then the baselines."""
    return list(METHODS)


def why_not_method(name: str, placement: Placement) -> str | None:
    """Why a method does not apply to the placement (the search modes apply to any), else None."""
    if name not in METHODS:
        raise UsageError(f"unknown method {name!r}; known: {', '.join(available_methods())}")
    return None if name in SEARCH_MODES else why_not(name, placement)


def run_method(name: str, placement: Placement, micro_batches: int, memory_limit: Any = None,
               **opts: Any) -> Schedule:
    if name not in available_methods():
        raise UsageError(f"unknown method {name!r}; known: {', '.join(available_methods())}")
    return METHODS[name](placement, micro_batches, memory_limit, **opts)
