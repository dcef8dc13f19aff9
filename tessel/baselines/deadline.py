"""A wall-clock deadline for a baseline build, set by the caller around it (the search's race).

Most baselines are one timing of closed-form orders; v-mem times a grid of candidate blocks,
5 CPU seconds at p = 16, m = 32 under V-Half's memory, 22 s of wall time on 2 cores at load 7:
raced by a 20 s search, it alone ran the search past its limit. The timing walks
(tessel.baselines.wfill) check the deadline as they go and stop with OutOfTime, a BaselineError,
so the race counts the baseline as not a candidate and goes on. Without a deadline set, the
builds run to the end as before (run_baseline, the bench, the CLI's baselines).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .shapes import BaselineError

_DEADLINE: ContextVar[float] = ContextVar("baseline_deadline", default=math.inf)


class OutOfTime(BaselineError):
    """A build stopped at the deadline its caller set."""


@contextmanager
def until(deadline: float) -> Iterator[None]:
    """Builds inside stop with OutOfTime past `deadline` (a time.perf_counter() value)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check() -> None:
    """OutOfTime when the deadline set around this build has passed."""
    if time.perf_counter() > _DEADLINE.get():
        raise OutOfTime("stopped at the race's deadline (the search's clock)")
