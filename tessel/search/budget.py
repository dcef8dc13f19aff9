"""The time of one search: one wall clock handed down, and the `Budget` saying how it is shared.

A time limit is a wall clock for the whole command: `command_clock` starts it at the command's
start (the CLI's `search` and `compare`, and `plan`, build it the same way), keeps back what
printing, writing and the interpreter's exit take, and `search()` hands it down. Below
`search()` time has one form, a `Clock`: a phase gets `clock.share(f)` (a fraction of what is
left, from now) or `clock.within(s)` (at most s seconds of it), asks `left()` or `expired()`,
and only `solver.Model.solve` turns it into CP-SAT's seconds. No phase is given all of it, so a
valid schedule is in hand at every moment (the search is anytime) and the result comes back
within the limit.

Every share, stall and cap is a field of `Budget` (one place to read and tune them); a `Stall`
says when a solve that stopped improving is stopped.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

MODES = ("tessel", "fast", "exact")  # the search modes (methods.py lists them among the methods)
OBJECTIVES = ("makespan", "span")
DEFAULT_LIMIT = {"tessel": 120.0, "fast": 60.0, "exact": 60.0}  # seconds, by mode
FAST_SMALL_BLOCKS = 200
FAST_LARGE_BLOCKS = 1000


@dataclass(frozen=True)
class Clock:
    """A wall clock: `limit` seconds from `t0` (a time.perf_counter() value)."""
    limit: float
    t0: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return max(self.limit - self.elapsed(), 0.0)

    def expired(self) -> bool:
        return self.left() <= 0.0

    @property
    def deadline(self) -> float:
        """The time.perf_counter() value at which it runs out."""
        return self.t0 + self.limit

    def share(self, fraction: float) -> Clock:
        """A clock for a phase: `fraction` of the time left, from now."""
        return Clock(self.left() * fraction)

    def within(self, seconds: float) -> Clock:
        """A clock for a phase: `seconds` from now, never past this clock's end."""
        return Clock(min(self.left(), max(seconds, 0.0)))


@dataclass(frozen=True)
class Stall:
    """When a solve that stopped improving stops: after `seconds` of wall time without a better
    solution (several workers), or after `work` deterministic seconds of the solver's work (one
    worker: the same on a loaded machine, so the same schedule every run)."""
    seconds: float
    work: float

    def times(self, k: float) -> Stall:
        return Stall(self.seconds * k, self.work * k)

    def within(self, work: float) -> Stall:
        """This stall with at most `work` deterministic seconds (what a budget of work has left)."""
        return Stall(self.seconds, min(self.work, max(work, 0.0)))


@dataclass(frozen=True)
class Budget:
    """How a search shares its wall clock: fractions of the time left when a phase starts,
    seconds, and the stalls of its solves. The defaults are the ones every mode uses."""
    # -- the command and the search as a whole
    exit_seconds: float = 0.75  # kept back by the CLI for printing, writing and the interpreter's exit ...
    exit_floor: float = 0.75  # ... but the search keeps at least this fraction of a short --time-limit
    reserve_share: float = 0.1  # of the limit kept back for building, checking and reporting the result
    reserve_per_task: float = 4e-5  # seconds of that reserve per task of the final schedule
    # -- the start
    race_share: float = 0.5  # the baselines raced at the start (skipped when one would take longer)
    fast_race_share: float = 0.8  # fast: its clock is short and the baselines are its best constructions
    race: bool = True  # race the baselines at all (off: the search's own schedule, for benchmarks)
    race_late: float = 0.01  # tessel: a race expected to take at most this share waits for our own completion
    baseline_per_task: float = 3e-5  # seconds one baseline (no repetend) is expected to take per task, until measured
    own_builds: float = 4.0  # the search's own schedule at N costs about this many baseline builds (unroll,
    # compaction, kernel check, the validated schedule): skipped when a baseline at the bound is in hand
    free_build: float = 0.05  # seconds: a linear pass shorter than this is never skipped for time,
    gated_tasks: int = 40_000  # ... nor one over at most this many tasks (race.BASELINE_TASKS: as before there)
    start_share: float = 0.1  # constructions tried upward from the bound before one micro-batch at a time
    fit_share: float = 0.5  # the one-micro-batch solve that proves (or finds) that memory fits
    # -- the repetend (mode tessel: the period search; mode fast: the polish at the bound)
    repetend_share: float = 0.5  # the period search (mode tessel)
    slice_share: float = 0.3  # of the period search's time left that one period's solve may take
    min_slice: float = 0.05  # seconds: a solve shorter than this decides nothing
    min_slice_work: float = 0.002  # deterministic seconds: the same for a slice of work
    slice_wall: float = 2.0  # a slice of work may take this many times its expected wall time (work_wall)
    copies_share: float = 0.5  # of the period search's time left for patterns of several micro-batches
    retry_share: float = 0.4  # tessel: periods the period search left undecided, tried again with more work
    escalate: float = 4.0  # ... with this many times the repetend stall's work
    grid_rivals: int = 1  # the raced baselines run again on the grid, the best real makespan first, to
    # complete the shortest like our own (passes/rivals.grid_baseline): this many (0: all of them)
    deep_share: float = 0.2  # the deepest repetend at the chosen period (the memory the limits leave)
    polish_share: float = 0.25  # fast: the solver polishing a construction that fits memory
    polish_cap: float = 10.0  # fast: seconds of that polish at most
    repair_share: float = 0.5  # fast: the solver repairing memory when no construction fits at the bound
    fast_small: float = 2.0  # fast: seconds at most up to FAST_SMALL_BLOCKS blocks,
    fast_large: float = 20.0  # ... and at FAST_LARGE_BLOCKS (linear between, proportional above)
    justify_share: float = 0.5  # fast: of the search's limit its justification rounds may be expected to take,
    justify_per_task: float = 5e-6  # ... at this many seconds per task walked (about an idle core's; 9-16 us
    # measured at load 7-10 on 2 shared cores): a count of rounds fixed by the limit, not a wall clock, so a
    # loaded machine gets the same schedule (32 devices, N = 128: 3 rounds at 128 blocks, 2 at 192)
    # -- completion and the end
    # the order polish (search/polish.py): tasks replayed, work not time (the same schedule on a loaded machine)
    order_least: int = 100_000  # tasks replayed at least (0.1-0.3 s on one core: search/replay.py) ...
    order_per_second: float = 100_000.0  # ... and per second of the search's limit (the limit, not the time left)
    order_work: int = 500_000  # ... at most: about a second on an idle core, whatever the limit (the default
    # limit, 120 s, gave 4M: 10 s for nothing on xshape-6 at N = 128, at 3,000 tasks a replay)
    order_stall: int = 500  # replays without a shorter makespan after which a walk stops (150 left zbv-4's
    # warm-up 3.8% above ZB-V's with profiled costs and latency, m = 12; 500 came within 0.6%)
    patience: float = 4.0  # the second round of completion waits this many times longer for an improvement
    # a completion's solves do at most this share of the search's limit (the limit given, not the time left) in
    # deterministic work, at work_wall wall seconds per deterministic second: the same limit gives the same work,
    # hence the same schedule, on a quiet and a loaded machine (the wall clock only cuts a solve that overruns)
    completion_share: float = 0.5
    work_wall: float = 10.0  # one worker's deterministic second took 7-35 s of wall on the completion models
    # (zbv-4, profiled costs and latency, 2 shared cores at load 2-8)
    orders_share: float = 0.35  # of the limit kept from the passes before it for the order polish (passes/orders.py)
    # ... (0.2 left it 0.8 s of a 5 s limit, a quarter of its work at load 5: zbv-4 rows 3-4% above ZB-V, 0.35 within 0.5%)
    orders_cap: float = 3.0  # ... seconds at most (its replay budget takes about that at 400 tasks)
    cuts_share: float = 0.5  # tessel, up to relax.GROUP_TASKS tasks: of the clock the race and the start leave,
    # kept from the passes before it for the whole problem with the relaxation's cuts (passes/whole.cuts): at 20 s,
    # 41 open rows of the peers grid (p = 4-8, V-Min's and the interleaved peers' memory among them), 14 shorter and
    # none longer than keeping it only beyond 15 s (izb, 6 devices, 18 micro-batches, unit costs, latency 0.5:
    # 73.5 -> 72.5; izb, 8 devices, 16, unit costs, 1F1B's memory: 54 -> 53); from 75 s on it is cuts_cap either way ...
    cuts_floor: float = 0.0  # ... beyond this many seconds (15 before: bench/budget_ab.py compares the two) ...
    cuts_least: float = 5.0  # ... its work at least this many seconds' worth (the clock left permitting) ...
    cuts_cap: float = 30.0  # ... seconds at most (zbv, 8 devices, 24 micro-batches, V-Min's memory: 18 s to the optimum)
    cuts_work: float = 1.0  # ... and its work: this many deterministic seconds per second kept (about one idle
    # core's: it ends on its work, not the clock, and gives the same schedule every run on a quiet machine)
    probe_share: float = 0.5  # ... of its clock and work first for probes from the proven bound up (relax.probe_starts)
    probes_first: float = 0.4  # > 0: the probes instead a pass of their own, this share of the clock, before
    # the best baseline completed like ours (passes/whole.probes), whose solves can leave the cuts no clock (zbv,
    # 4 devices, 8 micro-batches, profiled costs, V-Min's memory: 7 s of one warm-up, the bound 26 where the
    # probes then prove 27.056 against the optimum 27.976); on 40 open rows of the peers grid at 20 s, 0.4
    # against 0: the same makespans, the bound higher on 8 and lower on 2 (by at most 0.7%)
    exact_hint_share: float = 0.3  # exact: the tessel schedule that hints the whole-problem solve
    model_per_task: float = 4e-5  # seconds building a whole-problem model takes per task (30-60 us measured
    # on 2 shared cores): mode exact builds none the clock left cannot hold (131k tasks: 7 s before any solve)
    model_per_block: float = 1.5e-4  # ... and a period's model per block and copy (110-190 us: 8,192 blocks 1.6 s)
    expand_per_pair: float = 3e-6  # ... and a reservoir CP-SAT's presolve expands, per pair of its events (not
    # interruptible: a random placement of 5 devices, 128 micro-batches, 524k pairs: 1.4 s on 0.19 s left)
    repetend_builds: float = 6.0  # a raced baseline that wins: finding its repetend costs about this many builds
    # -- stalls: seconds without a better solution after which a solve stops
    stall_work: float = 0.5  # deterministic seconds of solver work per stall second (one worker)
    repetend_stall_least: float = 0.5  # a period's solve: blocks / repetend_stall_blocks seconds, in
    repetend_stall_most: float = 5.0  # ... [least, most]: the span is only a proxy for the warm-up's length
    repetend_stall_blocks: float = 50.0
    completion_stall_least: float = 0.4  # a warm-up or cool-down solve: free tasks / completion_stall_tasks
    completion_stall_most: float = 2.0  # ... seconds, in [least, most]
    completion_stall_tasks: float = 1000.0
    solve_cap: float = 4.0  # several workers: a solve stops after this many stalls' seconds at most
    # -- answer first, prove on request
    prove: bool = False  # solves run to their share (no cap) and the whole problem is solved to prove (--prove)
    settle: float = 0.01  # the passes that only may improve a good answer are skipped within this gap (unless prove)

    def working(self, time_limit: float) -> float:
        """Seconds of a command's --time-limit the work may take (the rest is the exit's)."""
        return max(time_limit - self.exit_seconds, time_limit * self.exit_floor)

    def reserve(self, limit: float, tasks: int) -> float:
        """Seconds kept back from the phases: building and checking schedules of `tasks` tasks."""
        return min(limit * self.reserve_share + tasks * self.reserve_per_task, limit * 0.5)

    def orders_reserve(self, limit: float) -> float:
        """Seconds of a search's limit the passes before the order polish leave it."""
        return min(limit * self.orders_share, self.orders_cap)

    def cuts_reserve(self, seconds: float) -> float:
        """Seconds of `seconds` the passes before the cuts' whole-problem solve leave it."""
        return min(max(seconds - self.cuts_floor, 0.0) * self.cuts_share, self.cuts_cap)

    def fast_limit(self, blocks: int) -> float:
        """Mode fast's own ceiling on its wall clock, whatever the time limit says."""
        if blocks <= FAST_SMALL_BLOCKS:
            return self.fast_small
        if blocks <= FAST_LARGE_BLOCKS:
            f = (blocks - FAST_SMALL_BLOCKS) / (FAST_LARGE_BLOCKS - FAST_SMALL_BLOCKS)
            return self.fast_small + f * (self.fast_large - self.fast_small)
        return self.fast_large * blocks / FAST_LARGE_BLOCKS

    def justify_rounds(self, limit: float, tasks: int) -> int:
        """Fast's justification rounds (two walks of `tasks` tasks each) that fit its share of `limit`."""
        return int(limit * self.justify_share / (2 * tasks * self.justify_per_task))

    def cap(self, stall: Stall, workers: int | None) -> float:
        """Wall seconds one solve with this stall may take, so that a solve that finds nothing
        never gets a whole share, unless the search is asked to prove. One worker (the default)
        needs none: its stall is a budget of all its work, which keeps it deterministic."""
        if self.prove or (workers or 1) <= 1:
            return math.inf
        return stall.seconds * self.solve_cap

    def order_budget(self, limit: float) -> int:
        """Tasks the order polish may replay in a search of `limit` seconds (all its seeds)."""
        return min(self.order_work, max(self.order_least, int(self.order_per_second * limit)))

    def models(self, tasks: int, clock: Clock, per: float | None = None) -> bool:
        """Whether `clock` holds building a model of `tasks` tasks (whole-problem; with `per`,
        seconds per unit of another model, e.g. model_per_block)."""
        return tasks * (self.model_per_task if per is None else per) < clock.left()

    def completion_work(self, limit: float) -> float:
        """Deterministic seconds of CP-SAT work one completion's solves may do in all, for a
        search of `limit` seconds (unbounded when asked to prove)."""
        return math.inf if self.prove else limit * self.completion_share / self.work_wall

    def period_work(self, limit: float) -> float:
        """Deterministic seconds of CP-SAT work the period search's solves may do in all, for a
        search of `limit` seconds: its slices are shares of it, so the same periods are decided
        on a quiet and a loaded machine (unbounded when asked to prove: shares of time then)."""
        return math.inf if self.prove else limit * self.repetend_share / self.work_wall

    def stall(self, seconds: float) -> Stall:
        return Stall(seconds, seconds * self.stall_work)

    def repetend_stall(self, blocks: int) -> Stall:
        """A period's solve: polishing the span pays little after a while (it only stands in for
        the warm-up's length)."""
        s = blocks / self.repetend_stall_blocks
        return self.stall(min(self.repetend_stall_most, max(self.repetend_stall_least, s)))

    def completion_stall(self, free_micro_batches: int, blocks: int) -> Stall:
        """A warm-up or cool-down solve freeing that many micro-batches of `blocks` blocks."""
        s = free_micro_batches * blocks / self.completion_stall_tasks
        return self.stall(min(self.completion_stall_most, max(self.completion_stall_least, s)))


def command_clock(time_limit: float, started: float | None = None, budget: Budget | None = None) -> Clock:
    """The clock of a command's --time-limit: from `started` (the command's start, a
    time.perf_counter() value; default now), less what the exit takes (Budget.working)."""
    b = budget or Budget()
    return Clock(b.working(time_limit), time.perf_counter() if started is None else started)
