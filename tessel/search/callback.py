"""The solution callback of solver.Model.solve, in its own module: it subclasses CP-SAT's, so
importing it imports CP-SAT (solver.py does so only when a solve needs it)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ortools.sat.python import cp_model

from .solver import Progress


class Reporter(cp_model.CpSolverSolutionCallback):
    """Reports each solution to `progress` and notes when the last one came (solver._Watcher's stall)."""

    def __init__(self, progress: Progress | None, phase: str, t0: float,
                 report: Callable[[int], dict[str, Any]] | None) -> None:
        super().__init__()
        self.progress, self.phase, self.t0, self.report = progress, phase, t0, report
        self.last_improvement: float | None = None

    def on_solution_callback(self) -> None:
        self.last_improvement = time.perf_counter()
        if not self.progress:
            return
        obj = round(self.objective_value)
        update = {"phase": self.phase, "objective": obj, "elapsed": time.perf_counter() - self.t0}
        if self.report:
            update.update(self.report(obj))
        self.progress(update)
