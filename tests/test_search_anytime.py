"""The anytime search: a schedule on placements nobody tuned it for, never worse than the baselines,
a report that survives a file, and the objective option."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_files import checker_verdict

from bench.dags import random_case
from tessel import bounds, library
from tessel.baselines import BASELINES, BaselineError, applicable, linear
from tessel.schedule import Schedule
from tessel.search import MemoryLimitError, SearchReport, search
from tessel.search.orchestrate import objective_value
from tessel.search.problem import make_problem


def checked(s: Schedule, tmp_path: Path) -> Schedule:
    assert s.errors() == []
    f = tmp_path / "s.json"
    s.save(f)
    checker_verdict(f)
    return s


def baselines(case_seed: int) -> dict[str, float]:
    c = random_case(case_seed)
    out = {}
    for name in applicable(c.placement):
        try:
            out[name] = BASELINES[name](c.placement, c.micro_batches, c.memory).makespan
        except BaselineError:
            pass
    return out


# seeds where the previous search gave up ("no repetend found"), with fractional costs, tight memory
@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 7, 9, 13])
@pytest.mark.parametrize("mode", ["tessel", "exact"])
def test_random_dags_get_a_valid_schedule_no_longer_than_any_baseline(seed: int, mode: str, tmp_path: Path) -> None:
    c = random_case(seed)
    s = checked(search(c.placement, c.micro_batches, c.memory, mode=mode, time_limit=2), tmp_path)
    assert s.micro_batches == c.micro_batches
    if c.memory is not None:
        assert all(peak <= lim + 1e-9 for peak, lim in zip(s.peak_memory, c.memory))
    for name, other in baselines(seed).items():
        assert s.makespan <= other + 1e-6, name
    # the reported bound is proven (rounded to 6 decimals) and at least the analytic one
    assert s.makespan >= s.meta["lower_bound"] - 1e-5
    assert s.meta["lower_bound"] >= bounds.lower_bound(c.placement, c.micro_batches) - 1e-5


@pytest.mark.slow
def test_fast_answers_on_random_dags_and_reports_what_it_did(tmp_path: Path) -> None:
    for seed in (3, 11):  # just-feasible memory: one micro-batch at a time is what fits at first
        c = random_case(seed)
        s = checked(search(c.placement, c.micro_batches, c.memory, mode="fast", time_limit=60), tmp_path)
        report = SearchReport.from_meta(s.meta)
        assert report.method == "fast" and report.lower_bound <= s.makespan
        assert report.gap == pytest.approx(s.makespan / report.lower_bound - 1, abs=1e-4)


@pytest.mark.slow
def test_the_report_is_written_into_meta_and_read_back_the_same(tmp_path: Path) -> None:
    p = library.build("vshape", devices=4)
    s = search(p, 12, 2, time_limit=60)
    report = SearchReport.from_meta(s.meta)
    f = tmp_path / "s.json"
    s.save(f)
    again = SearchReport.from_meta(Schedule.load(f).meta)
    assert again == report
    assert report.period == 8 and report.period_optimal and report.period_memory_bound == 8
    assert report.bound_source in ("analytic", "memory", "device", "solver")  # a whole solve may prove more
    # memory-aware: two activations held 16 units each at a time allow one micro-batch every 8
    assert report.lower_bound >= bounds.lower_bound(p, 12)
    with pytest.raises(KeyError, match="no search report"):
        SearchReport.from_meta({"method": "1f1b"})


def test_the_memory_bound_is_proven_and_met() -> None:
    p = library.build("vshape", devices=4)
    s = search(p, 24, 2, time_limit=60)
    # 24 micro-batches, each holding device 0's memory 16 units, 2 at a time: 24 * 16 / 2 = 192 plus tails;
    # the device bound (the third micro-batch's forward waits for the first one's release) adds the fill
    problem = make_problem(p, 2)
    little = max(bounds.memory_lower_bound(p, 24, d, h, lim) for d, (lim, h) in problem.real_holds().items())
    assert little > bounds.lower_bound(p, 24)
    assert s.meta["bound_source"] in ("memory", "device") and s.meta["lower_bound"] >= little
    assert s.makespan >= s.meta["lower_bound"]


def test_no_order_of_one_micro_batch_fits_is_proven_and_named() -> None:
    from tessel.placement import Block, make_placement
    # two activations on device 0 that are both alive before either is released
    blocks = [Block("a", "forward", 1, 2, (0,)), Block("b", "forward", 1, 2, (0,)),
              Block("c", "backward", 1, -4, (0,))]
    p = make_placement("both", 1, blocks, [("a", "c"), ("b", "c")])
    with pytest.raises(MemoryLimitError, match=r"device 0 reaches 4 one micro-batch at a time \(limit 3, proven least 2\)"):
        search(p, 4, 3, time_limit=60)
    assert search(p, 4, 4, time_limit=60).makespan == 12


def test_objective_span_is_an_option(tessel: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    p = library.build("vshape", devices=4)
    s = search(p, 16, 4, objective="span", time_limit=60)
    assert s.meta["objective"] == "span"
    assert objective_value(s, "span") <= s.makespan
    assert s.meta["lower_bound"] == 16 * max(p.loads)
    out = tmp_path / "v.json"
    rc, stdout, stderr = tessel("search", "--time-limit", "60", "vshape", "-n", "16", "--memory", "4", "--objective", "span", "-o", out)
    assert rc == 0, stderr
    assert "objective: span" in stdout
    assert json.loads(out.read_text())["meta"]["objective"] == "span"
    with pytest.raises(ValueError, match="unknown objective"):
        search(p, 4, objective="latency", time_limit=60)


@pytest.mark.slow
def test_the_shard_bound_proves_the_m_shape_optimal() -> None:
    p = library.build("mshape", devices=4)
    # the exact solve proves 60 optimal at N = 8 on its own; the fill bound reaches it too
    e = search(p, 8, 20, mode="exact", time_limit=60)
    assert e.meta["statuses"]["exact"] == "optimal" and e.makespan == 60
    assert bounds.shard_lower_bound(p, 8) == 60 > bounds.lower_bound(p, 8)
    s = search(p, 16, 20, time_limit=60)
    assert s.meta["bound_source"] == "shard" and s.meta["lower_bound"] == 108 == s.makespan
    assert s.meta["status"] == "optimal" and s.meta["gap"] == 0
    # no block on every device: nothing to add
    assert bounds.shard_lower_bound(library.build("vshape", devices=4), 16) == 0


def test_the_circle_check_agrees_with_the_pairwise_one() -> None:
    import random
    from bisect import insort

    from tessel.search.fast import _free
    rng = random.Random(7)
    for _ in range(200):
        T = rng.randint(4, 40)
        busy: list[tuple[int, int]] = []
        for _ in range(rng.randint(0, 6)):
            phase, dur = rng.randrange(T), rng.randint(1, 5)
            if all((phase - p) % T >= d and (p - phase) % T >= dur for p, d in busy):
                insort(busy, (phase, dur))
        phase, dur = rng.randrange(T), rng.randint(1, T)
        pairwise = all((phase - p) % T >= d and (p - phase) % T >= dur for p, d in busy)
        assert _free(busy, phase, dur, T) == pairwise, (busy, phase, dur, T)


def test_budget_shares_are_named_and_fast_has_its_own_ceiling() -> None:
    from tessel.search import Budget
    b = Budget()
    assert b.fast_limit(50) == b.fast_limit(200) == 2.0 and b.fast_limit(1000) == 20.0
    assert 2.0 < b.fast_limit(600) < 20.0 and b.fast_limit(2000) == 40.0
    assert b.reserve(10.0, 0) == pytest.approx(1.0) and b.reserve(2.0, 10**6) == pytest.approx(1.0)


def test_above_the_race_size_a_linear_baseline_at_the_bound_is_the_answer(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """What 4,096 devices x 64 micro-batches does, on a small placement: above BASELINE_TASKS only the
    baselines built in linear time race (1f1b on a plain pipeline, gpipe; greedy not), the first
    whatever the clock says; one at the bound whose clock cannot hold the search's own schedule
    (Budget.own_builds builds, none free) is the answer, with no completion run."""
    from tessel.search import Budget
    from tessel.search.passes import race
    monkeypatch.setattr(race, "BASELINE_TASKS", 10)
    calls: list[str] = []
    real = race.run_baseline
    monkeypatch.setattr(race, "run_baseline", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    p = library.vshape(4)
    s = checked(search(p, 16, time_limit=10, budget=Budget(own_builds=1e9, free_build=0.0, gated_tasks=0)), tmp_path)
    assert calls[0] == "1f1b" and "greedy" not in calls
    assert s.meta["base"] == "1f1b" and s.makespan == bounds.lower_bound(p, 16)
    assert set(s.meta["seconds"]) <= {"baselines", "final", "total"}  # no start, repetend or completion


def test_a_completion_the_clock_cannot_hold_is_the_plain_unroll_and_valid(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """No baseline fits the memory (1f1b and gpipe need 4 on device 0), so the search's own schedule
    is the answer however short the clock; one that cannot hold Budget.own_builds builds does not
    compact the plain unroll first (Modulo.unrolled is valid as it is): still valid, within the
    limit, and not shorter than the full completion."""
    from tessel.search import Budget
    from tessel.search.passes import race, vseed
    monkeypatch.setattr(race, "BASELINE_TASKS", 10)
    # the line construction fits 2 (shallower warm-ups) and races too: left out, so nothing raced fits
    monkeypatch.setattr(vseed, "line_chain", lambda p: None)
    p = library.vshape(4)
    lean = checked(search(p, 16, 2, time_limit=10, budget=Budget(own_builds=1e9, free_build=0.0, gated_tasks=0)), tmp_path)
    full = search(p, 16, 2, time_limit=10)
    assert max(lean.peak_memory) <= 2 and lean.meta["base"] == "repetend"
    assert full.makespan <= lean.makespan


def test_the_race_refuses_a_baseline_over_the_limit_from_its_orders_without_building_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Memory depends on each device's order alone: the race's pre-check refuses 1f1b and gpipe over
    the limit with the message their build would give, and neither is built (at 4,096 devices each
    build took seconds before it failed the limit)."""
    from tessel.search.passes import race
    p = library.vshape(4)
    for name in ("1f1b", "gpipe"):
        with pytest.raises(BaselineError) as e:
            BASELINES[name](p, 16, 2)
        assert race.over_limit(name, p, 16, (2, 2, 2, 2)) == str(e.value)
        assert race.over_limit(name, p, 16, (16, 16, 16, 16)) is None
    monkeypatch.setattr(race, "BASELINE_TASKS", 10)
    calls: list[str] = []
    monkeypatch.setattr(race, "run_baseline", lambda name, *a, **k: calls.append(name))
    s = checked(search(p, 16, 2, time_limit=10), tmp_path)
    assert calls == [] and max(s.peak_memory) <= 2 and s.meta["base"] in ("repetend", "justified")  # its own


def test_the_race_runs_linear_baselines_first_and_v_mem_only_below_zb_v_hand(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """The race builds the closed-form orders first (the cheapest: each one's time is the estimate
    that may skip the next) and spares v-mem (a grid of timings: 5 CPU seconds at p = 16, m = 32,
    the 20 s search's race three times its limit on a loaded machine) where ZB-V's hand order or
    DualPipeV fits; under V-Min's memory, where neither does, v-mem races."""
    from tessel.search.passes import race
    p = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)  # misses its bound: a race
    real = race.run_baseline
    calls: list[str] = []
    monkeypatch.setattr(race, "run_baseline", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    for memory, spared in ((8, True), (4, False)):
        calls.clear()
        s = checked(search(p, 8, memory, time_limit=3), tmp_path)
        assert max(s.peak_memory) <= memory and "baselines" in s.meta["seconds"]
        assert ("v-mem" not in calls) == spared and calls[-1] == "greedy"
        cheap = [n for n in calls if linear(n, p)]
        assert calls[:len(cheap)] == cheap and "zb-v-hand" in cheap, calls


def test_mode_exact_builds_no_model_the_clock_cannot_hold(tmp_path: Path) -> None:
    """A whole-problem model costs Budget.model_per_task per task to build before any solve (131k
    tasks: 7 s): one the clock left cannot hold is not built; the hint's schedule is the answer."""
    from tessel.search import Budget
    p = library.vshape(4)
    s = checked(search(p, 8, mode="exact", time_limit=5, budget=Budget(model_per_task=10.0)), tmp_path)
    assert s.meta["statuses"]["exact"] == "unknown" and "exact" in s.meta["seconds"]
    assert s.makespan <= BASELINES["1f1b"](p, 8, None).makespan
