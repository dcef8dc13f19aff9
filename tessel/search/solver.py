"""The one CP-SAT helper every search builds its models with.

A `Model` holds tasks as fixed-size intervals, collects them per device for `AddNoOverlap`
(a multi-device block's interval goes into each of its devices), adds precedences, memory
reservoirs, hints and the objective, and `solve` returns a `SolveResult` with the status
(optimal / feasible / infeasible / unknown), objective, proven bound and the values of the
variables that were registered under a key: a task's start under its `Key` (block, micro-batch),
a repetend's variables under a `PatternVar`. The time limit comes as the search's `Clock`: this
is the one place it becomes CP-SAT's seconds.
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..key import Key
from .budget import Clock, Stall

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

    from .callback import Reporter

log = logging.getLogger(__name__)

Expr = Any  # an int, IntVar or linear expression of CP-SAT
Progress = Callable[[dict[str, Any]], None]
# Same inputs, same schedule: one worker runs one deterministic search (CP-SAT's parallel
# portfolio does not; its interleaved mode is deterministic but failed to find repetends of
# several micro-batches that one worker finds in seconds), and a stall is a budget of the
# solver's deterministic time, not of wall time. Only a solve cut by the wall-clock time limit
# can differ between runs. More workers (--workers K) may be faster, and may differ run to run.
DEFAULT_WORKERS = 1


@dataclass(frozen=True)
class PatternVar:
    """A variable of a repetend's model: the start `s` = offset `q` x period + phase `r` of
    `block` in copy `copy` of the pattern."""
    kind: Literal["s", "q", "r"]
    block: str
    copy: int


VarKey = Key | PatternVar

# solves running now, so that a signal can stop them (see stop_all_solves)
_running: set[cp_model.CpSolver] = set()
_running_lock = threading.Lock()
# the deterministic seconds of work this thread's solves have done (a search runs in one thread)
_work = threading.local()



def _cp() -> Any:
    """CP-SAT's module, imported by the first model (with numpy and pandas it takes a second or
    more): a search answered by a raced baseline, 4,096 devices among them, never pays for it."""
    from ortools.sat.python import cp_model
    return cp_model


def load() -> None:
    """Import CP-SAT now (a search that will solve loads it before its passes share the clock,
    so a first solve's slice does not pay for the import)."""
    _cp()


def _status(code: Any) -> str:
    cp = _cp()
    return {cp.OPTIMAL: "optimal", cp.FEASIBLE: "feasible", cp.INFEASIBLE: "infeasible", cp.UNKNOWN: "unknown",
            cp.MODEL_INVALID: "invalid"}.get(code, "unknown")


@dataclass(frozen=True)
class SolveResult:
    status: str
    objective: int | None
    bound: int | None
    seconds: float
    values: Mapping[VarKey, int] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.status in ("optimal", "feasible")

    def starts(self) -> dict[Key, int]:
        """The tasks' starts among the values (a repetend's variables left out)."""
        return {k: v for k, v in self.values.items() if not isinstance(k, PatternVar)}


class Model:
    """A CP-SAT model of tasks on devices; see the module doc."""

    def __init__(self) -> None:
        self.cp: cp_model.CpModel = _cp().CpModel()
        self.vars: dict[VarKey, cp_model.IntVar] = {}
        self._on_device: dict[int, list[cp_model.IntervalVar]] = defaultdict(list)
        self._objective: Expr | None = None
        self._serial = 0

    def int_var(self, key: VarKey, lo: int, hi: int) -> cp_model.IntVar:
        """A variable whose value the result reports under `key` (and named after it)."""
        v = self.cp.new_int_var(int(lo), int(hi), _name(key))
        self.vars[key] = v
        return v

    def aux_var(self, name: str, lo: int, hi: int) -> cp_model.IntVar:
        """A named variable the result does not report."""
        return self.cp.new_int_var(int(lo), int(hi), name)

    def bool_var(self, name: str) -> cp_model.IntVar:
        return self.cp.new_bool_var(name)

    def occupy(self, start: Expr, duration: int, devices: Iterable[int], name: str = "") -> None:
        """The devices are busy for [start, start + duration); start may be a constant."""
        iv = self.cp.new_fixed_size_interval_var(start, int(duration), name or f"busy{self._count()}")
        for d in devices:
            self._on_device[d].append(iv)

    def precede(self, before: Expr, after: Expr, gap: int) -> None:
        """after >= before + gap (an edge: gap = duration + latency)."""
        self.cp.add(after >= before + int(gap))

    def equal(self, left: Expr, right: Expr) -> None:
        self.cp.add(left == right)

    def at_most(self, expr: Expr, bound: Expr) -> None:
        """expr <= bound (a linear expression or a sum of terms)."""
        self.cp.add(expr <= bound)

    def is_le(self, x: Expr, y: Expr, name: str) -> cp_model.IntVar:
        """A boolean equal to [x <= y]."""
        v = self.bool_var(name)
        self.cp.add(x <= y).only_enforce_if(v)
        self.cp.add(x > y).only_enforce_if(~v)
        return v

    def latest(self, name: str, lo: int, hi: int, ends: Iterable[Expr]) -> cp_model.IntVar:
        """A variable in [lo, hi] at or after every one of `ends` (a makespan, a span's end)."""
        v = self.aux_var(name, lo, hi)
        for e in ends:
            self.cp.add(v >= e)
        return v

    def earliest(self, name: str, lo: int, hi: int, starts: Iterable[Expr]) -> cp_model.IntVar:
        """A variable in [lo, hi] at or before every one of `starts`."""
        v = self.aux_var(name, lo, hi)
        for e in starts:
            self.cp.add(v <= e)
        return v

    def earliest_at(self, starts: Sequence[Expr], value: int) -> None:
        """The least of `starts` equals value (a single start is fixed there)."""
        if len(starts) == 1:
            self.cp.add(starts[0] == value)
        elif starts:
            self.cp.add_min_equality(value, list(starts))

    def _count(self) -> int:
        self._serial += 1
        return self._serial

    def reservoir(self, times: Sequence[Expr], deltas: Sequence[int], limit: int) -> None:
        """The running sum of deltas over time (all events at one time together) stays <= limit."""
        if not times:
            return
        low = -sum(abs(int(x)) for x in deltas) - 1
        self.cp.add_reservoir_constraint(list(times), [int(x) for x in deltas], low, int(limit))

    def holds(self, spans: Sequence[tuple[Expr, Expr, int]], limit: int) -> None:
        """Memory held over [start, end) by each span; their sum stays <= limit at all times."""
        if not spans:
            return
        ivs = []
        for start, end, _ in spans:
            n = self._count()
            size = self.cp.new_int_var(0, _cp().INT32_MAX, f"held{n}") if not isinstance(end, int) or \
                not isinstance(start, int) else end - start
            ivs.append(self.cp.new_interval_var(start, size, end, f"hold{n}"))
        self.cp.add_cumulative(ivs, [int(a) for _, _, a in spans], int(limit))

    def hint(self, var: cp_model.IntVar, value: int) -> None:
        self.cp.add_hint(var, int(value))

    def hints(self, values: Mapping[Any, int]) -> None:
        for key, value in values.items():
            if key in self.vars:
                self.cp.add_hint(self.vars[key], int(value))

    def minimize(self, expr: Expr, lower: int | None = None, upper: int | None = None) -> None:
        """Minimise expr; a known lower bound lets the solver stop as soon as it reaches it."""
        if lower is not None:
            self.cp.add(expr >= int(lower))
        if upper is not None:
            self.cp.add(expr <= int(upper))
        self._objective = expr
        self.cp.minimize(expr)

    def close_devices(self) -> None:
        """Add the devices' no-overlap constraints now rather than at the solve: where they stand
        among the constraints steers CP-SAT's search (relax.py's one-device bounds were measured
        with them before the delays and the memory)."""
        self._finish()

    def _finish(self) -> None:
        for ivs in self._on_device.values():
            if len(ivs) > 1:
                self.cp.add_no_overlap(ivs)
        self._on_device.clear()

    def solve(self, clock: Clock | None, workers: int | None = None, progress: Progress | None = None,
              phase: str = "solve", report: Callable[[int], dict[str, Any]] | None = None,
              stall: Stall | None = None, prove: bool = False, work: float | None = None,
              presolve: bool = True, probing: bool = True, lp: bool = True,
              expand: bool = True, first: bool = False) -> SolveResult:
        """Solve within what `clock` has left (None: no limit), or stop once a `stall` passes
        without a better solution; progress gets {phase, objective, elapsed,
        ...report(objective)} per solution. `prove` favours closing the bound (the full LP
        relaxation) over finding solutions. `work`: at most that many deterministic seconds;
        `presolve=False` skips CP-SAT's presolve (it expands a reservoir into an ordering per
        pair of events and can spend a whole small budget doing it); `probing=False` keeps the
        presolve but skips its probing (on the whole zbv problem with every reservoir, 8 devices,
        24 micro-batches: 15 s of probing before the hint's first solution, 1.6 s without);
        `lp=False` leaves out the linear relaxation (a probe of the whole problem at a tight
        horizon, relax.probe_starts: propagation finds or refutes it in half the wall time);
        `expand=False` keeps each reservoir one constraint with its own propagator, where CP-SAT
        would expand it into a literal and a precedence per pair of events (relax.probe_starts:
        a search node costs a fraction of the expanded one's); `first` stops at the first solution
        (relax.probe_starts from the top: the next probe asks for less)."""
        self._finish()
        t0 = time.perf_counter()
        solver = _solver(None if clock is None else clock.left(), workers, prove)
        if work is not None:
            solver.parameters.max_deterministic_time = float(work)
        solver.parameters.cp_model_presolve = presolve
        if not probing:
            solver.parameters.cp_model_probing_level = 0
        if not lp:
            solver.parameters.linearization_level = 0
        solver.parameters.expand_reservoir_constraints = expand
        solver.parameters.stop_after_first_solution = first
        deterministic_stall = stall is not None and solver.parameters.num_workers == 1
        if stall is not None and deterministic_stall:
            # a budget of work instead of a wall-clock stall: the same on a loaded machine
            solver.parameters.max_deterministic_time = float(stall.work)
        callback = None
        if self._objective is not None and (progress or stall):
            from .callback import Reporter  # it subclasses CP-SAT's callback: imported with it
            callback = Reporter(progress, phase, t0, report)
        watcher = _Watcher(solver, callback, stall.seconds) if stall and callback and not deterministic_stall else None
        with _registered(solver):
            code = solver.solve(self.cp, callback)
        if watcher:
            watcher.done.set()
        _work.seconds = work_done() + solver.response_proto.deterministic_time
        return self._result(solver, code, phase, t0)

    def _result(self, solver: cp_model.CpSolver, code: Any, phase: str, t0: float) -> SolveResult:
        status = _status(code)
        seconds = time.perf_counter() - t0
        if status not in ("optimal", "feasible"):
            log.info("%s: %s after %.2fs", phase, status, seconds)
            # with no solution in hand the objective's proven bound still holds (not when infeasible)
            b = solver.best_objective_bound if status == "unknown" and self._objective is not None else math.nan
            return SolveResult(status, None, round(b) if math.isfinite(b) else None, seconds)
        obj = bound = None
        if self._objective is not None:
            obj, bound = round(solver.objective_value), round(solver.best_objective_bound)
        values = {k: solver.value(v) for k, v in self.vars.items()}
        log.info("%s: %s objective %s bound %s in %.2fs", phase, status, obj, bound, seconds)
        return SolveResult(status, obj, bound, seconds, values)


def _solver(time_limit: float | None, workers: int | None, prove: bool) -> cp_model.CpSolver:
    solver: cp_model.CpSolver = _cp().CpSolver()
    solver.parameters.num_workers = max(1, int(workers or DEFAULT_WORKERS))
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.random_seed = 1
    # a Ctrl-C must stop the command, not end the solve as if its time ran out
    solver.parameters.catch_sigint_signal = False
    if prove:
        _proving(solver.parameters)
    return solver


def work_done() -> float:
    """Deterministic seconds of CP-SAT work that this thread's solves have done so far: with one
    worker the same count on a loaded machine, so a budget made of it keeps results the same."""
    return float(getattr(_work, "seconds", 0.0))


def stop_all_solves() -> int:
    """Ask every running solve to stop now (from any thread); returns how many were running.
    The CLI calls it when SIGINT/SIGTERM arrives: Python cannot run a signal handler while the
    main thread is inside a solve."""
    with _running_lock:
        solvers = list(_running)
    for s in solvers:
        s.stop_search()
    return len(solvers)


@contextlib.contextmanager
def _registered(solver: cp_model.CpSolver) -> Iterator[None]:
    with _running_lock:
        _running.add(solver)
    try:
        yield
    finally:
        with _running_lock:
            _running.discard(solver)


def _proving(params: Any) -> None:
    """On few cores the default portfolio proves scheduling bounds slowly; the full LP
    relaxation (max_lp) closes them many times faster on the exact models."""
    if params.num_workers == 1:
        params.linearization_level = 2
    elif params.num_workers == 2:
        params.subsolvers.extend(["max_lp", "default_lp"])


class _Watcher:
    """Stops a solve that has found a solution and not improved it for `stall` seconds."""

    def __init__(self, solver: cp_model.CpSolver, reporter: Reporter, stall: float) -> None:
        self.solver, self.reporter, self.stall = solver, reporter, stall
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.done.wait(min(0.02, self.stall / 4)):
            last = self.reporter.last_improvement
            if last is not None and time.perf_counter() - last > self.stall:
                self.solver.stop_search()
                return


def _name(key: VarKey) -> str:
    """A readable variable name of a key: ('f0', 1) -> f0_1, PatternVar('s', 'f0', 1) -> s_f0_1."""
    if isinstance(key, PatternVar):
        return f"{key.kind}_{key.block}_{key.copy}"
    if isinstance(key, tuple):
        return "_".join(str(x) for x in key)
    return str(key)
