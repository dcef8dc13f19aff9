"""Grouped repetends of looped placements (search/grouped.py) and the pass that completes them
(search/passes/rounds.py): valid repetends at the expected period, within the memory limits,
and the search alone reaching the grouped completion where its own repetends complete longer."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.placement import Placement
from tessel.search import Budget, search
from tessel.search.completion import compact, makespan, plain_unroll
from tessel.search.grouped import grouped
from tessel.search.modulo import steady_memory
from tessel.search.problem import make_problem

N = 16  # micro-batches unrolled: warm-up, four groups' steady state and cool-down


@pytest.mark.parametrize("placement", [library.interleaved_zb(4, latency=0.5), library.build("interleaved", devices=4)],
                         ids=["interleaved-zb-latency", "interleaved"])
def test_grouped_repetends_hold_p_micro_batches_at_p_load_bounds(placement: Placement, tmp_path: Path) -> None:
    problem = make_problem(placement, 8)
    mods = grouped(problem)
    assert mods, "a looped pipeline has grouped repetends under 8 activations a device"
    best = mods[0]
    # four micro-batches every four load bounds: the latency hidden behind the group's other members
    assert best.copies == 4 and best.period == 4 * problem.period_bound
    for mod in mods:
        assert max(steady_memory(problem, mod)) <= 8
        starts = plain_unroll(mod, N)
        assert all(starts[(b, k)] >= starts[(a, k)] + problem.gap(a, b)
                   for a, b in problem.units.edges for k in range(N))
        problem.grid_schedule(N, starts)  # devices and memory (rules 2 to 4) over the unroll
    s = problem.schedule(N, compact(problem, N, plain_unroll(best, N)), None, None, {"base": "grouped"})
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.errors() == [] and max(s.peak_memory) <= 8


def test_tighter_limits_get_fewer_forwards_ahead_at_longer_periods() -> None:
    problem = make_problem(library.build("interleaved", devices=4), 6)
    mods = grouped(problem)
    assert mods and all(max(steady_memory(problem, m)) <= 6 for m in mods)
    assert min(m.period for m in mods) > 4 * problem.period_bound  # 8 activations are needed at the bound


def test_a_placement_that_is_not_looped_has_none() -> None:
    assert grouped(make_problem(library.build("vshape", devices=4), None)) == []


def test_the_search_alone_completes_the_grouped_repetend_on_a_looped_pipeline(tmp_path: Path) -> None:
    # the zero-bubble repository's profiled costs (a chunk: half a stage) and latency at 4 devices,
    # torch InterleavedZeroBubble's memory: its order runs 12 micro-batches in 32.48; the period
    # search's 2-copy repetend completes to 34.77, the grouped one unrolls to 32.50
    p = library.interleaved_zb(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    problem = make_problem(p, 8, 12)
    unrolled = min(makespan(problem, compact(problem, 12, plain_unroll(m, 12))) for m in grouped(problem))
    s = search(p, 12, 8, time_limit=5, budget=Budget(race=False))
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.errors() == [] and max(s.peak_memory) <= 8
    assert s.makespan <= problem.real(unrolled) + 1e-9 and s.makespan <= 32.5 * 1.0001
