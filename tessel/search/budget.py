"""The time budget of one search: its wall clock, and how the phases share it.

A time limit is a wall clock for the whole search: every phase asks the clock what is left and
no phase is given all of it, so a valid schedule is in hand at every moment (the search is
anytime) and the result comes back within the limit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

MODES = ("tessel", "fast", "exact")
OBJECTIVES = ("makespan", "span")
DEFAULT_LIMIT = {"tessel": 120.0, "fast": 60.0, "exact": 60.0}  # seconds, by mode


@dataclass(frozen=True)
class Budget:
    """How a search shares its time limit (fractions of the time left when a phase starts,
    and seconds). The defaults are the ones every mode uses."""
    reserve_share: float = 0.1  # of the limit kept back for building, checking and reporting the result
    reserve_per_task: float = 4e-5  # seconds of that reserve per task of the final schedule
    start_share: float = 0.1  # constructions tried upward from the bound before one micro-batch at a time
    repetend_share: float = 0.5  # the period search (mode tessel)
    retry_share: float = 0.4  # tessel: periods the period search left undecided, tried again with more work
    deep_share: float = 0.2  # the deepest repetend at the chosen period (the memory the limits leave)
    polish_share: float = 0.25  # fast: the solver polishing a construction that fits memory
    polish_cap: float = 10.0  # fast: seconds of that polish at most
    repair_share: float = 0.5  # fast: the solver repairing memory when no construction fits at the bound
    exact_hint_share: float = 0.3  # exact: the tessel schedule that hints the whole-problem solve
    race_share: float = 0.5  # the baselines raced at the start (skipped when one would take longer)
    fast_race_share: float = 0.8  # fast: its clock is short and the baselines are its best constructions
    race: bool = True  # race the baselines at all (off: the search's own schedule, for benchmarks)
    baseline_per_task: float = 3e-5  # seconds one baseline (no repetend) is expected to take per task, until measured
    repetend_builds: float = 6.0  # a raced baseline that wins: finding its repetend costs about this many builds
    fit_share: float = 0.5  # the one-micro-batch solve that proves (or finds) that memory fits
    fast_small: float = 2.0  # fast: seconds at most up to FAST_SMALL_BLOCKS blocks,
    fast_large: float = 20.0  # ... and at FAST_LARGE_BLOCKS (linear between, proportional above)

    def reserve(self, limit: float, tasks: int) -> float:
        """Seconds kept back from the phases: building and checking schedules of `tasks` tasks."""
        return min(limit * self.reserve_share + tasks * self.reserve_per_task, limit * 0.5)

    def fast_limit(self, blocks: int) -> float:
        """Mode fast's own ceiling on its wall clock, whatever the time limit says."""
        if blocks <= FAST_SMALL_BLOCKS:
            return self.fast_small
        if blocks <= FAST_LARGE_BLOCKS:
            f = (blocks - FAST_SMALL_BLOCKS) / (FAST_LARGE_BLOCKS - FAST_SMALL_BLOCKS)
            return self.fast_small + f * (self.fast_large - self.fast_small)
        return self.fast_large * blocks / FAST_LARGE_BLOCKS

    @staticmethod
    def repetend_stall(blocks: int) -> float:
        """Seconds without a shorter span after which a period's solve stops: the span is only
        a proxy for the warm-up's length, so polishing it pays little after a while."""
        return min(5.0, max(0.5, blocks / 50))

    @staticmethod
    def completion_stall(free_micro_batches: int, blocks: int) -> float:
        """Seconds without a shorter end after which a warm-up or cool-down solve stops."""
        return min(2.0, max(0.4, free_micro_batches * blocks / 1000))


FAST_SMALL_BLOCKS = 200
FAST_LARGE_BLOCKS = 1000


@dataclass
class Clock:
    """The wall clock of one search (or of one phase given a share of it)."""
    limit: float
    t0: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return max(self.limit - self.elapsed(), 0.0)

    def share(self, fraction: float) -> Clock:
        """A clock for a phase: `fraction` of the time left, from now."""
        return Clock(self.left() * fraction)
