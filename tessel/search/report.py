"""What a search says about how it got its schedule: the `SearchReport` kept in the schedule's
`meta` (FORMAT.md: free-form JSON), written on save and read back the same way."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..placement import Number


@dataclass(frozen=True)
class SearchReport:
    """The figures of one search. `lower_bound` is the best proven lower bound of the objective
    (`bound_source` says which argument proved it); `gap` is the schedule against it."""
    method: str  # the mode: tessel, fast or exact
    objective: str  # makespan or span
    status: str  # optimal (the bound is reached), feasible, or time_limit (the clock ran out)
    base: str  # what the schedule came from: repetend, whole, exact, or a baseline's name
    lower_bound: Number
    bound_source: str  # analytic (FORMAT.md), shard (fill through all-device blocks), memory (Little's law),
    # device (one device at a time, latency and memory delays task by task, the device's work to give
    # memory back, holds.release_floors, and the work the memory lets start before each release and end
    # after each tail, holds.device_ramp: bounds.device_lower_bound), solver,
    # probe (horizons of the whole problem refuted from the bound up: search.relax.probe_starts, the cuts pass),
    # relaxation (one device exactly, CP-SAT: search.relax; with Budget.prove only)
    gap: float  # objective / lower_bound - 1
    search_seconds: float
    period: Number | None = None  # per micro-batch, real time
    repetend_micro_batches: int = 1
    period_optimal: bool = False  # no smaller period per micro-batch exists (proven)
    periods_undecided: tuple[Number, ...] = ()  # periods per micro-batch below `period` no solve decided
    period_lower_bound: Number = 0  # the device-load bound
    period_memory_bound: Number = 0  # the memory (Little's law) bound
    span: Number | None = None  # of the repetend's pattern
    in_flight: int | None = None  # repetitions overlapping one window of the steady state
    steady_memory: tuple[Number, ...] = ()
    resolution: Number = 1  # real time of one grid unit
    exact_time: bool = True  # the grid durations equal the real ones
    statuses: Mapping[str, Any] = field(default_factory=dict)  # of every solve, by phase
    seconds: Mapping[str, float] = field(default_factory=dict)  # by phase

    def to_meta(self) -> dict[str, Any]:
        """The report as JSON-ready meta fields (tuples become lists)."""
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
            elif isinstance(v, Mapping):
                out[k] = dict(v)
        return out

    @staticmethod
    def from_meta(meta: Mapping[str, Any]) -> SearchReport:
        """The report of a schedule's meta (fields it does not know are ignored); raises
        KeyError naming a missing field when the meta holds no search report."""
        kw: dict[str, Any] = {}
        for f in fields(SearchReport):
            if f.name in meta:
                v = meta[f.name]
                kw[f.name] = tuple(v) if isinstance(v, list) else v
        for name in REQUIRED:
            if name not in kw:
                raise KeyError(f"schedule meta holds no search report: missing {name!r}")
        return SearchReport(**kw)


REQUIRED = ("method", "objective", "status", "base", "lower_bound", "bound_source", "gap", "search_seconds")
