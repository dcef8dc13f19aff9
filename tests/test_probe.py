"""Probes of the whole problem from the proven bound up (relax.probe_starts, the first half of
passes/whole.cuts): where the bound is the optimum a probe at it finds a schedule there that the
rules accept; a refuted horizon raises the bound, which stays below the exact optimum; and the
search keeps what the probes find."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict
from test_bounds import _tiny_v
from test_relax import _optimum

from tessel import bounds, library
from tessel.baselines import BASELINES, run_baseline
from tessel.placement import Number, Placement
from tessel.schedule import Schedule
from tessel.search import Budget, relax, search
from tessel.search.budget import Clock
from tessel.search.passes.whole import cuts, probes
from tessel.search.polish import in_order
from tessel.search.problem import Problem, make_problem
from tessel.search.relax import Probed, probe_starts
from tessel.search.state import State
from tessel.timing import earliest_starts, orders_from_starts, orders_of, schedule_from_orders


def _probe(problem: Problem, n: int, hint: Schedule, floor: Number, work: float = 4.0,
           top: bool = False) -> tuple[Probed, Schedule | None]:
    """The probes from `floor` hinted by `hint`, and the schedule their orders replay to."""
    p = problem.placement
    out = probe_starts(problem, n, earliest_starts(p, n, in_order(orders_of(hint))), floor, Clock(120.0), work,
                       top=top)
    if out.starts is None:
        return out, None
    return out, schedule_from_orders(p, n, orders_from_starts(p, out.starts), problem.real_limit(), None, {})


def _izb(devices: int) -> tuple[Placement, tuple[int, ...]]:
    """interleaved-zb, unit costs (half a stage a chunk), latency 0.5, under the memory of torch's
    ScheduleInterleavedZeroBubble (2p chunk activations a device: bench/results/peers-v-full.md)."""
    return library.interleaved_zb(devices, forward=0.5, backward=0.5, weight=0.5, latency=0.5), (2 * devices,) * devices


@pytest.mark.parametrize("devices,n,bound", [(4, 8, 33.5), (6, 12, 51.5)])
def test_a_probe_at_the_bound_finds_the_optimum_the_hint_missed(tmp_path: Path, devices: int, n: int,
                                                               bound: float) -> None:
    p, memory = _izb(devices)
    problem = make_problem(p, memory, n)
    floor = bounds.device_lower_bound(p, n, problem.real_holds())
    assert floor == bound
    hint = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)  # 36 and 56: the bound is 7-9% below
    assert hint.makespan > bound + 2
    out, s = _probe(problem, n, hint, floor)
    assert s is not None and out.makespan is not None
    assert s.errors() == [] and all(a <= b for a, b in zip(s.peak_memory, memory))
    assert s.makespan == bound and out.bound == bound
    path = tmp_path / "probe.json"
    s.with_meta(base="probe").save(path)
    checker_verdict(path)


@pytest.mark.slow
@pytest.mark.parametrize("top", [False, True])
def test_the_probes_bound_and_schedule_bracket_the_exact_optimum_on_random_v_placements(top: bool) -> None:
    # from a floor far below (half the optimum) the refuted horizons raise the bound; it never
    # passes the optimum (from the top too, where an undecided probe proves nothing), and a
    # schedule found is valid, never below the optimum nor above the hint
    checked, raised, found = 0, 0, 0
    for seed in range(16):
        p, n, memory = _tiny_v(seed)
        got = _optimum(p, n, memory)
        if got is None:
            continue
        problem, opt = got
        hint = BASELINES["greedy"](p, n, memory)
        out, s = _probe(problem, n, hint, opt / 2, work=2.0, top=top)
        assert opt / 2 <= out.bound <= opt + 1e-9, (seed, opt, out.bound)
        if s is not None:
            assert s.errors() == [] and all(a <= b + 1e-9 for a, b in zip(s.peak_memory, memory))
            assert opt - 1e-9 <= s.makespan <= hint.makespan + 1e-9, (seed, opt, s.makespan)
            found += 1
        checked += 1
        raised += out.bound > opt / 2 + 1e-9
    assert checked >= 12 and raised >= checked - 1 and found >= checked // 2, (checked, raised, found)


def test_the_search_keeps_the_probes_schedule_and_their_bound() -> None:
    # the cuts pass on a state whose best is interleaved-zb-h1's: the probes' schedule replaces it,
    # and the bound the state reports is the optimum they reached
    p, memory = _izb(4)
    n = 12
    state = State(make_problem(p, memory, n), n, Clock(120.0), 1, None, Budget(race=False), "makespan")
    state.best = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)
    probes(state, Clock(120.0))  # Budget.probes_first: a pass of their own, then the cuts' descent
    cuts(state, Clock(120.0))
    s = state.best
    assert s is not None and s.meta["base"] == "probe" and s.errors() == []
    assert s.makespan == state.lower_bound()[0] == 45.5
    assert state.statuses["probe"] == "found" and "cuts" not in state.statuses  # at the bound: no descent


def test_a_default_search_reports_the_bound_its_probes_prove(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/test_relax.py's V: without holds.release_floors the arguments prove 30; the probes refute
    # every horizon below the schedule the search finds, so it is reported optimal by their bound
    monkeypatch.setattr(bounds, "release_floors", lambda *_: {})
    v = library.zbv(2, forward=1, backward=1, weight=1, latency=2)
    problem = make_problem(v, 4, 4)
    assert bounds.device_lower_bound(v, 4, problem.real_holds()) < 35
    s = search(v, 4, 4, time_limit=20)
    assert s.errors() == []
    assert s.meta["bound_source"] == "probe" and s.meta["lower_bound"] == 35 == s.makespan


def _relaxed_optimum(problem: Problem, n: int, upper: Number, expand: bool) -> int | None:
    """The optimum (grid units) of the relaxation of every device at once, its reservoirs expanded or not."""
    _, rows, fifo, res = relax._inputs(problem, n, upper)
    built = relax._model(problem, res, n, tuple(range(problem.placement.devices)), rows, fifo, relax._down(upper, res), 0)
    assert built is not None
    out = built[0].solve(Clock(60.0), 1, presolve=False, probing=False, lp=False, expand=expand)
    assert out.status == "optimal"
    return out.objective


def test_the_probes_unexpanded_reservoirs_keep_the_memory_limit() -> None:
    """probe_starts keeps each reservoir one constraint (Model.solve's expand=False): the optimum
    of its model is the expanded model's, and above the same model's without the limits wherever
    memory binds (so the unexpanded reservoir is enforced, not dropped)."""
    binding = 0
    for seed in range(6):
        p, n, memory = _tiny_v(seed)
        upper = n * sum(b.duration * len(b.devices) for b in p.blocks) + 10 * p.latency
        kept = make_problem(p, memory, n)
        got = _relaxed_optimum(kept, n, upper, expand=False)
        assert got == _relaxed_optimum(kept, n, upper, expand=True), seed
        free = _relaxed_optimum(make_problem(p, None, n), n, upper, expand=False)
        assert free is not None and got is not None and got >= free
        binding += got > free
    assert binding >= 1


@pytest.mark.parametrize("per_pair,descends", [(0.0, True), (1.0, False)])
def test_the_descent_is_skipped_when_expanding_its_reservoirs_would_overrun_the_clock(
        monkeypatch: pytest.MonkeyPatch, per_pair: float, descends: bool) -> None:
    # CP-SAT's presolve expands each reservoir into a literal per pair of events and cannot be cut
    # short: a descent started on 0.19 s left ran 1.4 s (a random placement, 128 micro-batches)
    p, memory = _izb(4)
    n = 12
    problem = make_problem(p, memory, n)
    assert relax.event_pairs(problem, n) == 4 * (2 * 2 * n) ** 2  # two chunks a device, each a pair of events
    calls: list[float] = []
    monkeypatch.setattr(relax, "probe_starts", lambda *a, **k: Probed(None, None, 0))
    monkeypatch.setattr(relax, "cut_starts", lambda *a, **k: calls.append(a[4].left()))
    state = State(problem, n, Clock(120.0), 1, None, Budget(race=False, expand_per_pair=per_pair), "makespan")
    state.best = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)
    cuts(state, Clock(60.0))
    assert bool(calls) == descends


def _horizons(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The horizon (grid units) of every probe relax.probe_starts builds from now on."""
    asked: list[int] = []
    model = relax._model

    def recorded(*a: object) -> object:
        asked.append(a[6])  # type: ignore[arg-type]
        return model(*a)  # type: ignore[arg-type]
    monkeypatch.setattr(relax, "_model", recorded)
    return asked


@pytest.mark.parametrize("top", [False, True])
def test_probes_from_the_top_ask_halfway_down_first(monkeypatch: pytest.MonkeyPatch, top: bool) -> None:
    # beyond PROBE_TASKS the probe at the bound can take minutes (interleaved-zb, 16 devices, 48
    # micro-batches) where one halfway down finds a schedule in a second: `top` starts there
    p, memory = _izb(4)
    n = 12
    problem = make_problem(p, memory, n)
    floor = bounds.device_lower_bound(p, n, problem.real_holds())
    hint = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)
    starts = earliest_starts(p, n, in_order(orders_of(hint)))
    asked = _horizons(monkeypatch)
    out = probe_starts(problem, n, starts, floor, Clock(120.0), 4.0, top=top)
    res = relax.grid(p, hint.makespan)
    lo, hi = relax._down(floor, res), relax._down(hint.makespan, res)
    assert asked[0] == ((lo + hi) // 2 if top else lo)
    assert out.makespan is not None and floor <= out.bound <= out.makespan * res and out.makespan < hi
    assert top or out.makespan == lo  # from the bound up: the optimum (45.5) at once
    assert all(b < a for a, b in zip(asked, asked[1:])) or not top  # each probe from the top asks for less


def test_the_cuts_pass_probes_from_the_top_beyond_probe_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the same state as above with PROBE_TASKS below its tasks: halving down from the hint, no
    # probe at the bound, and no descent (beyond GROUP_TASKS too)
    monkeypatch.setattr(relax, "PROBE_TASKS", 100)
    monkeypatch.setattr(relax, "GROUP_TASKS", 100)
    p, memory = _izb(4)
    n = 12
    state = State(make_problem(p, memory, n), n, Clock(120.0), 1, None, Budget(race=False), "makespan")
    state.best = hint = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)
    bound = state.lower_bound()[0]
    asked = _horizons(monkeypatch)
    probes(state, Clock(120.0))
    cuts(state, Clock(120.0))
    s = state.best
    assert s is not None and s.meta["base"] == "probe" and s.errors() == []
    assert bound <= s.makespan <= (bound + hint.makespan) / 2 and state.lower_bound()[0] <= s.makespan
    assert relax._down(bound, relax.grid(p, hint.makespan)) not in asked[:1]
    assert "cuts" not in state.statuses


@pytest.mark.parametrize("first", [0.0, 0.25])
def test_the_probes_run_as_a_pass_of_their_own_with_probes_first(monkeypatch: pytest.MonkeyPatch, first: float) -> None:
    # Budget.probes_first: the probes before the best baseline is completed (passes/whole.probes),
    # and the cuts pass then only descends; without it the probes pass does nothing
    p, memory = _izb(4)
    n = 12
    state = State(make_problem(p, memory, n), n, Clock(120.0), 1, None, Budget(race=False, probes_first=first),
                  "makespan")
    state.best = hint = run_baseline("interleaved-zb-h1", p, n, memory, repetend=False)
    probes(state, Clock(60.0))
    s = state.best
    assert s is not None and s.errors() == []
    assert (s.meta.get("base"), s.makespan) == (("probe", 45.5) if first else (None, hint.makespan))
    state.best = hint
    probed: list[object] = []
    monkeypatch.setattr(relax, "probe_starts", lambda *a, **k: probed.append(a) or Probed(None, None, 0))
    monkeypatch.setattr(relax, "cut_starts", lambda *a, **k: None)
    cuts(state, Clock(60.0))
    assert bool(probed) == (not first) and state.statuses["cuts"] == "none"
