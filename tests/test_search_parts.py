"""Search internals against independent checks: the steady-state memory formula against rule 4 on
unrolled schedules, the grid, constructions, kernels, the solver helper, completion and exact."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from shared_files import checker_verdict, suite_case

from tessel import library
from tessel.placement import Block, Placement, make_placement
from tessel.search.budget import Budget, Clock
from tessel.search.completion import compact, complete, makespan, plain_unroll
from tessel.search.exact import fifo_blocks, solve_exact
from tessel.search.fast import construct, constructions, packed
from tessel.search.kernel import kernel_starts
from tessel.search.modulo import Modulo, fits, memory_time, steady_memory
from tessel.search.problem import least_memory, make_problem
from tessel.search.repetend import (
    IN_SPAN,
    RepetendResult,
    deepest,
    find_repetend,
    modulo_of,
    retry_undecided,
    solve_period,
)
from tessel.search.solver import Model


def placement(name: str) -> Placement:
    return Placement.from_dict(suite_case(name)["placement"])


@pytest.mark.parametrize("name", ["vshape-4", "xshape-4", "kshape-4", "nnshape-4", "alphafold-4"])
def test_steady_memory_formula_matches_rule_4_on_long_unrolls(name: str) -> None:
    p = placement(name)
    checked = 0
    for limit in (3, 6):
        problem = make_problem(p, limit)
        for period in (problem.period_bound, problem.period_bound + 3):
            res = solve_period(problem, period, Clock(10), 2)  # found in well under a second unloaded
            if not res.found:
                continue
            mod = modulo_of(res.values, problem, period)
            s = problem.grid_schedule(40, plain_unroll(mod, 40))  # validates rule 4 at the limit
            assert list(s.peak_memory) == steady_memory(problem, mod)
            assert max(s.peak_memory) <= limit
            checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_steady_memory_of_several_copies_matches_rule_4() -> None:
    problem = make_problem(placement("vshape-4"), 3)
    res = solve_period(problem, 16, Clock(60), 2, copies=3)  # optimal in seconds; room for a loaded machine
    mod = modulo_of(res.values, problem, 16, 3)
    s = problem.grid_schedule(60, plain_unroll(mod, 60))
    assert list(s.peak_memory) == steady_memory(problem, mod) and max(s.peak_memory) == 3


def test_a_hint_over_the_memory_limits_proves_nothing_for_the_period() -> None:
    # zbv, 3 devices, profiled chunk costs, 3 activations per device: at this period the shortest
    # pattern without the limits (span 13,260 units) holds too much, and every pattern that fits is
    # longer (18,801); hinted by the first, the solve finds none within its span, which is no proof
    # that none fits at the period (it was reported "infeasible", and the period search took it as one)
    problem = make_problem(library.zbv(3, forward=0.5, backward=0.488, weight=0.252), 3)
    T = round(3.9697265625 / problem.resolution)
    free = solve_period(replace(problem, limit=None), T, Clock(30), 1)
    assert free.found
    over = modulo_of(free.values, problem, T)
    assert not fits(problem, over)
    assert solve_period(problem, T, Clock(30), 1, hint=over).status == IN_SPAN
    res = solve_period(problem, T, Clock(30), 1)
    assert res.found and res.objective is not None and res.objective > over.span(problem)
    mod = modulo_of(res.values, problem, T)
    s = problem.grid_schedule(12, plain_unroll(mod, 12))  # the four rules, memory at the limit included
    assert max(s.peak_memory) <= 3
    # without a hint "infeasible" stays a proof: below the device load no pattern exists
    assert solve_period(problem, problem.period_bound - 1, Clock(30), 1).status == "infeasible"


@pytest.mark.parametrize(("name", "copies"), [("vshape-4", 1), ("xshape-4", 1), ("kshape-4", 1), ("vshape-4", 2)])
def test_the_steady_level_integrates_to_the_memory_time_the_period_search_cuts_with(name: str, copies: int) -> None:
    """repetend._little bounds modulo.memory_time by the cap times the period: valid only if the
    level of the unrolled steady state, integrated over one period, is that memory-time (plus
    what a repetition leaves), so that its average, at most the peak, is under the cap."""
    problem = make_problem(placement(name), 4)
    checked = 0
    for period in (problem.period_bound * copies, problem.period_bound * copies + 5):
        res = solve_period(problem, period, Clock(20), 2, copies=copies)  # well under a second unloaded
        if not res.found:
            continue
        mod = modulo_of(res.values, problem, period, copies)
        reps = mod.in_flight(problem) + 1
        starts = plain_unroll(mod, (reps + 2) * copies)
        a = reps * period  # a window every repetition before it has reached, none after it touches
        for d in problem.limited_devices():
            integral, on_d = 0, set(problem.memory_blocks(d))
            for (b, _), t in starts.items():
                if b not in on_d:
                    continue
                x = problem.memory[b]
                e = t + problem.duration[b] if x < 0 else t  # allocated at the start, released at the end
                integral += x * (a + period - max(e, a)) if e < a + period else 0
            left = problem.memory_left(d) * copies
            assert integral == memory_time(problem, mod.start, copies, d) + left * period
            assert integral <= problem.cap(d) * period  # the cut holds on every pattern that fits
        checked += 1
    assert checked >= 1


def test_little_law_bound_is_tight_on_a_pipeline() -> None:
    problem = make_problem(placement("vshape-4"), 3)
    assert problem.memory_period_bound == Fraction(16, 3)  # device 0 holds each activation 16 units
    assert make_problem(placement("vshape-4"), 20).memory_period_bound == Fraction(16, 20)
    res = find_repetend(problem, Clock(90))  # seconds unloaded; room for a loaded machine
    assert res.modulo.per_micro_batch == Fraction(16, 3) and res.period_optimal


def test_exact_grid_for_decimals_and_rounded_up_grid_otherwise() -> None:
    p = library.build("vshape", devices=4, forward=0.25, backward=0.75)
    pr = make_problem(p, None)
    assert pr.exact_time and pr.resolution == 0.25 and pr.duration["f0"] == 1 and pr.duration["b0"] == 3
    q = library.build("vshape", devices=4, forward=1 / 3, backward=2 / 3)
    qr = make_problem(q, None)
    assert not qr.exact_time
    assert all(qr.duration[b.id] * qr.resolution >= b.duration for b in q.blocks)  # never shorter
    assert qr.period_bound * qr.resolution < 1.002 * max(q.loads)


def test_memory_scale_keeps_decimal_limits_exact() -> None:
    p = library.build("vshape", devices=4, memory=0.5)
    pr = make_problem(p, 1.5)
    assert pr.memory_scale == 10 and pr.limit == (15,) * 4 and pr.memory["f0"] == 5
    assert least_memory(pr.units) == [5, 5, 5, 5]


def test_least_memory_counts_ancestors_on_the_device() -> None:
    pr = make_problem(placement("kshape-4"), None)
    assert least_memory(pr.units) == [2, 2, 2, 2]  # a branch's forward, then the joint block on all


@pytest.mark.parametrize("name", ["vshape-4", "mshape-4", "nnshape-6", "kshape-4", "xshape-6"])
def test_constructions_are_repetends_that_respect_dependencies_and_devices(name: str) -> None:
    problem = make_problem(placement(name), None)
    built = constructions(problem, problem.period_bound)
    assert built, "the packed construction exists at the load bound on the suite's shapes"
    for mod in built:
        starts = mod.starts()
        assert all(starts[(b, 0)] >= starts[(a, 0)] + problem.gap(a, b) for a, b in problem.units.edges)
        problem.grid_schedule(12, plain_unroll(mod, 12))  # rules 2 and 3 over many micro-batches


def test_construction_fails_cleanly_when_a_period_is_too_short() -> None:
    problem = make_problem(placement("mshape-4"), None)
    assert construct(problem, 5) is None and packed(problem, 5) is None


def test_kernel_is_found_in_a_plain_unroll_and_not_across_a_break() -> None:
    problem = make_problem(placement("vshape-4"), None)
    mod = find_repetend(problem, Clock(10)).modulo  # the chain back to back: f at 0..3, b at 4, 7, 10, 13
    starts = plain_unroll(mod, 12)
    nb = len(problem.block_ids)
    assert next(kernel_starts(starts, 12, nb, mod.period, 1)) == 10  # first window with all 8 blocks
    late = {(b, k): s + (k >= 5) for (b, k), s in starts.items()}  # micro-batches 5.. one unit later
    found = list(kernel_starts(late, 12, nb, mod.period, 1))
    fourth = [s for (b, k), s in late.items() if k == 4]
    assert found and found[0] == 10
    assert not [w for w in found if any(w <= s < w + mod.period for s in fourth)]


def test_compaction_never_lengthens_and_keeps_memory() -> None:
    problem = make_problem(placement("mshape-4"), 20)
    mod = find_repetend(problem, Clock(10)).modulo
    plain = plain_unroll(mod, 16)
    tight = compact(problem, 16, plain)
    assert makespan(problem, tight) < makespan(problem, plain)
    a, b = problem.grid_schedule(16, plain), problem.grid_schedule(16, tight)
    assert a.peak_memory == b.peak_memory


def test_completion_reaches_the_lower_bound_where_it_is_reachable() -> None:
    problem = make_problem(placement("xshape-4"), 20)
    mod = find_repetend(problem, Clock(10)).modulo
    done = complete(problem, plain_unroll(mod, 16), 16, [3, 4], Clock(10), 2, Budget().stall(0.2),
                    problem.lower_bound(16))
    assert makespan(problem, done.starts) == problem.lower_bound(16) == 132
    problem.grid_schedule(16, done.starts)


def test_memory_holds_and_event_reservoir_agree() -> None:
    """An unpaired placement (memory released by a block that is no descendant) is modelled by
    events; the paired one by holds; both keep rule 4 in the exact solve."""
    blocks = [Block("a", "forward", 1, 2, (0,)), Block("b", "forward", 1, 0, (1,)),
              Block("c", "backward", 1, -2, (0,))]
    paired = make_placement("paired", 2, blocks, [("a", "b"), ("b", "c")])
    unpaired = make_placement("unpaired", 2, blocks, [("b", "c")])
    for p in (paired, unpaired):
        pr = make_problem(p, 4)
        res = solve_exact(pr, 5, Clock(20), 2)
        assert res.status == "optimal"
        s = pr.grid_schedule(5, {k: v for k, v in res.values.items() if isinstance(k, tuple)})
        assert max(s.peak_memory) <= 4
    assert make_problem(paired, 4).memory_pairs(0) == [("a", "c", 2)]
    assert make_problem(unpaired, 4).memory_pairs(0) is None


def test_fifo_symmetry_only_where_it_is_safe() -> None:
    assert fifo_blocks(make_problem(placement("mshape-4"), None)) == list(make_problem(placement("mshape-4"), None).block_ids)
    k = make_problem(placement("kshape-4"), None)
    assert fifo_blocks(k) == ["f0"]  # two roots joined: only one root may be ordered
    x = make_problem(placement("xshape-4"), None)
    assert len(fifo_blocks(x)) == len(x.block_ids)  # two independent chains, each a tree


def test_solver_helper_reports_status_objective_bound_and_values() -> None:
    m = Model()
    a = m.int_var("a", 0, 10)
    b = m.int_var("b", 0, 10)
    m.occupy(a, 3, [0])
    m.occupy(b, 4, [0])
    m.precede(a, b, 3)
    end = m.cp.new_int_var(0, 20, "")
    m.cp.add(end >= b + 4)
    m.minimize(end, lower=0)
    res = m.solve(Clock(5), 2)
    assert res.status == "optimal" and res.objective == res.bound == 7
    assert res.values == {"a": 0, "b": 3}
    m2 = Model()
    x = m2.int_var("x", 0, 1)
    m2.cp.add(x >= 2)
    assert m2.solve(Clock(5), 1).status == "infeasible" and not m2.solve(Clock(5), 1).found


def test_repetend_search_proves_smaller_periods_infeasible() -> None:
    problem = make_problem(placement("vshape-4"), 2)
    res = find_repetend(problem, Clock(30))
    assert res.modulo.period == 8 and res.period_optimal
    assert fits(problem, res.modulo)
    # below the Little's-law bound nothing is even tried
    assert all(t >= 8 * c for c, t, _ in res.tried)
    assert Modulo(8, res.modulo.phase, res.modulo.offset).per_micro_batch == 8


@pytest.mark.slow
def test_the_deepest_repetend_fills_the_memory_it_is_given() -> None:
    """zb with latency at twice 1F1B's memory: the least-span repetend keeps p - d micro-batches on
    device d; the deepest one at the same period holds more, up to the limit and never above it."""
    p = make_problem(library.zb(4, forward=1, backward=1, weight=1, latency=0.5), 8)
    least = find_repetend(p, Clock(30)).modulo
    deep = deepest(p, least, Clock(30), 1)
    assert deep is not None and deep.period == least.period == 6  # grid of 0.5
    assert steady_memory(p, least) == [4, 3, 2, 1]
    assert fits(p, deep) and sum(steady_memory(p, deep)) > sum(steady_memory(p, least))
    assert max(steady_memory(p, deep)) == 8
    unrolled = p.grid_schedule(20, deep.unrolled(range(20)))  # rule 4 agrees with the formula
    assert max(unrolled.peak_memory) <= 8
    assert deepest(make_problem(library.zb(4), None), least, Clock(30), 1) is None  # no limit: nothing to fill


def test_an_undecided_period_is_tried_again_and_replaces_a_longer_repetend() -> None:
    p = make_problem(library.build("vshape", devices=4), 8)
    slow = next(m for m in constructions(p, p.period_bound + 2) if fits(p, m))
    res = RepetendResult(slow, "construction", "none", False, ((1, p.period_bound, "unknown"),),
                         ((1, p.period_bound),), 0.0)
    again = retry_undecided(p, res, Clock(30), 1)
    assert again.modulo.period == p.period_bound < slow.period and fits(p, again.modulo)
    assert again.period_optimal and again.undecided == () and again.tried[-1][:2] == (1, p.period_bound)
    s = p.grid_schedule(12, again.modulo.unrolled(range(12)))
    assert s.errors() == []


def test_answer_first_races_the_baselines_only_when_its_own_schedule_misses_the_bound(tmp_path: Path) -> None:
    from tessel.search import search
    case = suite_case("vshape-4")
    s = search(placement("vshape-4"), 16, case["memory"], time_limit=30)
    assert s.errors() == [] and s.makespan == s.meta["lower_bound"]  # 1F1B's own: nothing to race against
    assert "baselines" not in s.meta["seconds"]
    case = suite_case("xshape-6")
    s = search(placement("xshape-6"), 16, case["memory"], time_limit=60)
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    # the proven 136 (137 before the justified unroll closed the last 0.7%): nothing raced, nor deep passes
    assert s.errors() == [] and s.makespan == s.meta["lower_bound"] == 136 and "baselines" not in s.meta["seconds"]
    assert "deepest" not in s.meta["seconds"] and "completion_deep" not in s.meta["statuses"]
    # zbv with the zero-bubble repository's profiled costs and latency misses its bound (21.44, latency
    # left out): the baselines race after the search's own completion, and the hand-made ZB-V order's
    # 21.79 is the most the search returns
    p = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    s = search(p, 8, [8] * 4, time_limit=5)
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.errors() == [] and s.makespan > s.meta["lower_bound"] and "baselines" in s.meta["seconds"]
    assert s.makespan <= 21.792 + 1e-9 and max(s.peak_memory) <= 8


@pytest.mark.slow
def test_asked_to_prove_the_settling_passes_run_within_the_settling_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from tessel.search import search
    # without the justification, shapes and cuts passes, zbv on 4 devices with V-Min's memory ends
    # at 27.976 over its bound of 26: within a settling gap of 10%, the passes that only might improve
    # a good answer are skipped, and run when the search is asked to prove (xshape-6 used to stop
    # 1 above its bound here; since the repetend's start is anchored it meets it)
    orchestrate = importlib.import_module("tessel.search.orchestrate")
    monkeypatch.setitem(orchestrate.PASSES, "tessel", tuple(
        p for p in orchestrate.PASSES["tessel"] if p.name not in ("unrolled", "justify", "shapes")))
    monkeypatch.setattr(orchestrate, "TESSEL_END", tuple(p for p in orchestrate.TESSEL_END if p.name != "cuts"))
    v = library.zbv(4, forward=0.5, backward=0.488, weight=0.252)
    settled = search(v, 8, 4, time_limit=10, budget=Budget(settle=0.1))
    proved = search(v, 8, 4, time_limit=10, budget=Budget(prove=True, settle=0.1))
    assert settled.errors() == [] and proved.errors() == []
    bound = settled.meta["lower_bound"]
    assert bound < settled.makespan <= 1.1 * bound
    assert "settled" in settled.meta["statuses"] and "deepest" not in settled.meta["seconds"]
    assert "settled" not in proved.meta["statuses"] and {"deepest", "whole"} <= set(proved.meta["seconds"])
    assert proved.makespan <= settled.makespan + 1e-9


def test_a_period_the_limits_leave_unsolved_is_solved_without_them_when_that_fits() -> None:
    # ZB-V's costs on the V: without memory constraints the bound's period is solved at once, and
    # that repetend fits 1F1B's limits (9, 9, 10, 10); where its span is
    # optimal it is optimal there too (the same objective under fewer constraints)
    from tessel.search.repetend import _Search
    p = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    problem = make_problem(p, [9, 9, 10, 10], 8)
    run = _Search(problem, Clock(60.0), 1, None, Budget())
    T = problem.period_bound
    found = run.relaxed(T, constructions(problem, T)[0])
    assert found is not None and found.modulo.period == T and fits(problem, found.modulo)
    assert run.tried == [(1, T, found.status)] and found.status in ("optimal", "feasible")
    assert _Search(make_problem(p, None, 8), Clock(60.0), 1, None, Budget()).relaxed(T, None) is None
