"""`search()`: the orchestrator. A search is a list of passes (passes/) over one State, each
given its share of one wall clock (budget.py); the lists below are the whole story.

Every mode is anytime: before any solve it holds a valid schedule, a repetend that fits memory
(a construction, or one micro-batch at a time) and, unless the race waits (below), the best of
the applicable baselines; every later pass only replaces it by a better one.

tessel: the period search brackets between that repetend's period and the bound, from a repetend
        read off a list schedule when that one is better (passes/start.listed; periods left
        undecided are tried again with more work on the clock it left), then completion, and the
        completed schedule and (few micro-batches) the plain unroll justified as fast's is, and
        while still above the bound the starting construction's unroll justified (fast's seed); a
        construction at the period found completed too when a quick completion prefers it
        (passes/shapes.py: the least span misleads on interleaved placements with latency), and
        on looped placements a repetend of p micro-batches run in chunk rounds, unrolled before
        the period search and completed after the completion (passes/rounds.py, search/grouped.py: no solve
        finds it in seconds); on V and line placements a construction read off the placement is a first
        answer (and, with no baseline raced, a seed of the order polish) (passes/vseed.py, search/vbuild.py,
        search/linebuild.py).
        Up to relax.GROUP_TASKS tasks, a schedule still more than Budget.settle above the bound
        then gets Budget.cuts_reserve of the clock (half of what the race and the start leave,
        30 s at most) for the whole problem with the relaxation's cuts, after the baseline
        completed like ours (passes/whole.cuts: tight memory, where warm-up and cool-down decide):
        half of it probes horizons from the proven bound up (relax.probe_starts; up to
        relax.PROBE_TASKS tasks, on what the passes left), where a refuted horizon raises the
        bound and a schedule at the bound ends the search; beyond, up to relax.PROBE_TOP_TASKS
        tasks, they halve down from the best schedule (Budget.probes_first, the default: the
        probes as a pass of their own, before the best baseline is completed like ours).
fast:   constructed repetend, the solver only polishes its span (stops when it stalls), the whole
        schedule justified backward and forward by list scheduling (justify.py), completion.
exact:  the tessel schedule as a hint, then the whole N-micro-batch problem in one solve.

The applicable baselines race against the result up to race.BASELINE_TASKS tasks (N x blocks)
and while one fits the race's share of the clock, and above it those built in linear time (the
first one whatever the clock says: the answer when time runs out): the search never returns a
schedule longer than any baseline that ran. Answer first: when the race is cheap (race.cheap: at
most Budget.race_late of the clock), modes tessel and exact run it, whole, after their own
completion and only when that schedule misses the proven bound (no baseline can beat it then);
otherwise, and always in mode fast, the race comes first. The bound in the report is the best
proven one (bounds.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import SearchError
from ..placement import Number, Placement
from ..schedule import Schedule
from . import relax
from .budget import DEFAULT_LIMIT, MODES, OBJECTIVES, Budget, Clock
from .passes.complete import completion, deepest_repetend
from .passes.final import final, summary
from .passes.justify import completion_after, construction, justification, justify_both, unrolled
from .passes.orders import orders
from .passes.period import period_search, polish, retry
from .passes.race import cheap, late, racing
from .passes.rivals import completed_baseline
from .passes.rounds import grouped_completion, grouped_seed
from .passes.shapes import shapes
from .passes.start import listed, start
from .passes.vseed import vbuild_seed
from .passes.vstart import vmem_seed, vmem_start
from .passes.whole import cuts, exact, hinted, probes, whole
from .polish import MOST_TASKS
from .problem import make_problem
from .solver import DEFAULT_WORKERS, Progress, load
from .state import State, objective_value
from .warm import warm_start

__all__ = ["objective_value", "search"]


@dataclass(frozen=True)
class Pass:
    """One phase: its name (its lap in meta.seconds), what it does, and its budget: the share
    of the clock left when it starts (None: all of it; the pass bounds its own solves). Answer
    first: a pass is skipped once the search's own schedule meets the proven bound, and with
    `rivals` once a raced baseline does (the search's own repetend is still found and completed
    when a baseline meets the bound first: it unrolls, and a tie keeps it). A `settle` pass
    only might improve a good answer, at a cost no stall bounds well (the solver's work per
    second varies tenfold between models): it is skipped once the best schedule is within
    Budget.settle of the proven bound, unless the search is asked to prove."""
    name: str
    run: Callable[[State, Clock], None]
    share: Callable[[Budget], float] | None = None
    rivals: bool = False
    always: bool = False
    settle: bool = False


def run_passes(state: State, passes: Sequence[Pass]) -> None:
    """Answer first: the passes in turn until a schedule meets the best proven bound (or a
    baseline does, and the clock left cannot hold the search's own schedule: State.answered; or,
    for the passes that settle, comes within Budget.settle of it)."""
    for p in passes:
        if not p.always and (state.at_bound(p.rivals) or state.answered()):
            continue
        if p.settle and not state.budget.prove and state.at_bound(p.rivals, state.budget.settle):
            state.statuses.setdefault("settled", []).append(p.name)
            continue
        t0 = time.perf_counter()
        clock = state.clock if p.share is None else state.clock.share(p.share(state.budget))
        p.run(state, clock)
        state.lap(p.name, t0)


COMPLETION = (
    Pass("unrolled", unrolled),  # the plain unroll justified: a seed, before the solves take the clock
    Pass("completion", completion),  # warm-up and cool-down solves, each with a stall
    Pass("justify", justify_both, rivals=True),  # list scheduling backward and forward: packs both ends
    Pass("baselines", late),  # the race, when cheap and not run first; skipped when ours meets the bound
    Pass("deepest", deepest_repetend, rivals=True, settle=True),  # Budget.deep_share for the deepest repetend, completed
    Pass("baselines", completed_baseline, rivals=True, settle=True),  # the best baseline on the grid, completed like ours
    Pass("whole", whole, rivals=True, settle=True),  # few tasks: one solve of the whole problem, with a stall
)
TESSEL = (
    Pass("vbuild", vbuild_seed),  # V or line: its construction, a first answer (a polish seed when not raced)
    Pass("vmem_start", vmem_start),  # V under a tight limit: v-mem's steady state when better, and a seed
    Pass("listed", listed),  # a repetend read off a list schedule: the period search's start when better
    Pass("grouped", grouped_seed),  # a looped placement's p-copy repetends, unrolled: the shortest a seed
    Pass("repetend", period_search, lambda b: b.repetend_share),
    Pass("repetend", retry, lambda b: b.retry_share),  # the periods left undecided, more work each
    *COMPLETION[:3],
    Pass("justify", construction, rivals=True, settle=True),  # the construction's unroll justified, as fast's
    Pass("shapes", shapes, rivals=True, settle=True),  # a construction at the period found, when it completes shorter
    Pass("grouped", grouped_completion, rivals=True, settle=True),  # ... completed, when close to the best
)
# the rest of tessel's passes, on the clock the ones above kept (Budget.cuts_reserve); the cuts' solve after
# the baseline completed like ours (zbv, p = 6, 18 micro-batches, V-Min's memory: v-mem completed reaches
# 59.272 where the cuts' solve in its place stopped at 60.356), hinted by the best so far; a schedule at or
# near the bound skips it
TESSEL_END = (
    COMPLETION[3],  # the race when late
    Pass("probes", probes, lambda b: b.probes_first, rivals=True, settle=True),  # Budget.probes_first
    COMPLETION[5],  # the best baseline completed like our own
    Pass("cuts", cuts, rivals=True, settle=True),  # the whole problem with cuts: probed up to relax.PROBE_TASKS tasks
    COMPLETION[4], COMPLETION[6],  # the deepest repetend, the whole problem's quick solve
    Pass("vmem_seed", vmem_seed),  # the v-mem seed, if nothing offered it yet
)
PASSES: dict[str, tuple[Pass, ...]] = {
    "tessel": TESSEL,
    # Budget.polish_share (polish_cap) or repair_share; the unrolled repetend justified (a fixed work budget),
    # completed when that is not enough, the completion justified in turn (passes/justify.py)
    "fast": (Pass("polish", polish), Pass("justify", justification, rivals=True),
             Pass("completion", completion_after), Pass("justify", justification, rivals=True),
             *COMPLETION[3:]),
    "exact": (Pass("hint", hinted(lambda s, _: run_passes(s, (*TESSEL, *(p for p in TESSEL_END if p.name != "cuts")))), lambda b: b.exact_hint_share),
              Pass("exact", exact, always=True)),  # the rest of the clock: the mode is the solver's proof
}


def search(placement: Placement, micro_batches: int, memory: Number | Sequence[Number] | None = None,
           mode: str = "tessel", time_limit: float | None = None, workers: int | None = None,
           progress: Progress | None = None, objective: str = "makespan", started: float | None = None,
           budget: Budget | None = None, clock: Clock | None = None,
           starts: Sequence[Schedule] | Mapping[str, Schedule] = ()) -> Schedule:
    """The schedule of `micro_batches` micro-batches under per-device `memory` limits.

    Raises MemoryLimitError (a TesselError) naming the least limit per device when one
    micro-batch cannot fit; otherwise returns a valid schedule within the time limit, the best
    found, and says how it got it in meta (SearchReport). The wall clock is `clock` (a
    command's, budget.command_clock), else `time_limit` seconds (default by mode) from
    `started` (a time.perf_counter() value, default now). `budget` shares it between the passes
    (default Budget(); Budget(race=False) leaves the baselines out, to measure the search on its
    own). `starts`: schedules to start from (another generator's, an earlier run's; a mapping names
    them, else they are numbered): each device's order timed on this placement and checked under
    `memory` (warm.warm_start: SearchError naming what does not fit), then raced like a baseline,
    whatever `budget.race` says, and polished like one: the search never answers longer than they
    are."""
    t0 = time.perf_counter() if started is None else started
    _check_args(micro_batches, mode, time_limit, workers, objective)
    budget = budget or Budget()
    problem = make_problem(placement, memory, micro_batches)  # checks the horizon too
    outer = clock or Clock(time_limit if time_limit is not None else DEFAULT_LIMIT[mode], t0)
    limit = outer.limit
    if mode == "fast":
        limit = min(limit, budget.fast_limit(len(placement.blocks)))
    limit -= budget.reserve(limit, micro_batches * len(placement.blocks))
    # the order polish is kept a share: a completion stopped by the clock would leave it none
    # (mode exact gives the solver's proof all of it)
    polished = mode != "exact" and objective == "makespan" and micro_batches * len(placement.blocks) <= MOST_TASKS
    cut = mode == "tessel" and objective == "makespan" and relax.tasks(placement, micro_batches) <= relax.GROUP_TASKS
    passes = limit - budget.orders_reserve(limit) * polished
    state = State(problem, micro_batches, Clock(passes, outer.t0), workers or DEFAULT_WORKERS, progress, budget,
                  objective)
    named = starts.items() if isinstance(starts, Mapping) else ((str(i), x) for i, x in enumerate(starts, 1))
    state.rivals += [warm_start(x, placement, micro_batches, problem.real_limit(), label) for label, x in named]
    if budget.models(len(placement.blocks), state.clock.share(budget.repetend_share * budget.slice_share),
                     budget.model_per_block):  # a first period solve could run: CP-SAT loaded off its slice
        load()
    share = (lambda b: b.fast_race_share) if mode == "fast" else (lambda b: b.race_share)
    first = () if mode != "fast" and cheap(state) else (Pass("baselines", racing(share)),)
    run_passes(state, (*first, Pass("start", start)))
    if cut:  # the cuts' share of what the race and the start left (a race that ran first keeps its own)
        state.clock = Clock(passes - budget.cuts_reserve(state.clock.left()), outer.t0)
    run_passes(state, PASSES[mode])
    if mode == "tessel":
        state.clock = Clock(passes, outer.t0)
        run_passes(state, TESSEL_END)
    state.clock = Clock(limit, outer.t0)
    run_passes(state, (Pass("orders", orders), Pass("final", final, always=True)))
    report = summary(state, mode)
    assert state.best is not None, "the start pass leaves a repetend or a baseline"
    state.report(phase="done", makespan=state.best.makespan, period=report.period)
    return state.best.with_meta(**report.to_meta())


def _check_args(n: int, mode: str, time_limit: float | None, workers: int | None, objective: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SearchError(f"micro_batches must be a positive integer, got {n!r}")
    if mode not in MODES:
        raise SearchError(f"unknown search mode {mode!r}; known: {', '.join(MODES)}")
    if objective not in OBJECTIVES:
        raise SearchError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if time_limit is not None and not time_limit > 0:
        raise SearchError(f"time limit must be > 0 seconds, got {time_limit!r}")
    if workers is not None and workers < 1:
        raise SearchError(f"workers must be >= 1, got {workers!r}")
