"""The whole problem with the relaxation's cuts as a search pass (passes/whole.cuts,
relax.cut_starts): hinted by a valid schedule, it returns a valid one no longer than the hint,
never below the bound the same model proves, and the search keeps it where it is shorter."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel.baselines import BASELINES, vmem
from tessel.library import zbv
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.passes.whole import cuts
from tessel.search.problem import make_problem
from tessel.search.relax import group_bound
from tessel.search.state import State

V_MIN = (4, 4, 4, 4)  # V-Min's chunk activations a device on zbv, 4 devices (bench/results/bound_gap-v.md)


def _state(latency: float, n: int, work_seconds: float) -> State:
    v = zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=latency)
    state = State(make_problem(v, V_MIN, n), n, Clock(120.0), 1, None, Budget(race=False), "makespan")
    state.best = BASELINES["v-mem"](v, n, V_MIN)
    # the pass's work: Budget.cuts_least deterministic seconds (no share of the clock reserved)
    state.budget = Budget(race=False, cuts_share=0.0, cuts_least=work_seconds)
    return state


def test_the_cuts_shorten_v_mems_schedule_under_v_min_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the hint: v-mem with its blocks' own warm-ups only (29.192); squeezed blocks (tests/test_squeeze.py)
    # give 28.680 here, where 4 deterministic seconds of the cuts' solve find nothing shorter
    monkeypatch.setattr(vmem, "SQUEEZED", ())
    state = _state(0.032, 8, 4.0)
    # the descent alone: the probes before it (tests/test_probe.py) find a shorter schedule here too
    state.budget = replace(state.budget, probe_share=0.0)
    hint = state.best
    assert hint is not None
    cuts(state, Clock(120.0))
    s = state.best
    assert s is not None and s is not hint and s.meta["base"] == "cuts"
    assert s.errors() == [] and max(s.peak_memory) <= 4
    # shorter than v-mem's order, and never below what every device at once proves
    bound = group_bound(state.problem, 8, upper=hint.makespan, work=2.0)
    assert bound - 1e-9 <= s.makespan < hint.makespan - 1e-9, (bound, s.makespan, hint.makespan)
    path = tmp_path / "cuts.json"
    s.save(path)
    checker_verdict(path)


def test_the_cuts_are_the_same_schedule_every_run() -> None:
    a, b = (_state(0, 8, 1.0) for _ in range(2))
    cuts(a, Clock(120.0))
    cuts(b, Clock(120.0))
    assert a.best is not None and b.best is not None
    assert a.best.start == b.best.start


def test_a_search_near_its_bound_leaves_the_cuts_alone() -> None:
    # settled within Budget.settle of the proven bound: the pass is skipped and says so
    v = zbv(4, forward=0.5, backward=0.488, weight=0.252)
    s = search(v, 8, memory=16, time_limit=10, budget=Budget(race=False))
    assert s.errors() == []
    assert "cuts" not in s.meta["statuses"]
