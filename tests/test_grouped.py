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
from tessel.search.grouped import GROUPS, MOST_TASKS, grouped, grouped_lists, groups
from tessel.search.justify import no_overlap
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


# 16 devices, the zero-bubble repository's profiled costs (a chunk: half a stage) and latency,
# torch InterleavedZeroBubble's memory (32 chunk activations a device): its order runs 32
# micro-batches in 92.832
P16 = dict(forward=0.5, backward=0.488, weight=0.252, latency=0.032)


def test_groups_shrink_to_fit_the_task_cap_at_16_devices() -> None:
    assert groups(4, 2, 24) == groups(8, 2, 48) == GROUPS  # unchanged up to 8 devices
    assert groups(16, 2, 96) == 5 and 16 * 5 * 96 <= MOST_TASKS
    assert groups(16, 4, 192) == 4 + 3  # never under the chunk rounds and 3: over the cap, none
    assert grouped(make_problem(library.interleaved_zb(16, chunks=4), 64)) == []


def test_grouped_repetends_at_16_devices_are_valid_and_at_the_load_bound() -> None:
    problem = make_problem(library.interleaved_zb(16, **P16), 32)
    mods = grouped(problem)
    assert mods and mods[0].copies == 16 and mods[0].period == 16 * problem.period_bound
    for mod in mods:
        assert no_overlap(problem, mod) and max(steady_memory(problem, mod)) <= 32
        s = problem.grid_schedule(48, plain_unroll(mod, 48))  # rules 1 to 4 over three repetitions
        assert list(s.peak_memory) == steady_memory(problem, mod)  # the sorted levels match rule 4


def test_grouped_lists_fit_memory_and_match_the_peer_at_16_devices(tmp_path: Path) -> None:
    p = library.interleaved_zb(16, **P16)
    problem = make_problem(p, 32, 32)
    lists = grouped_lists(problem, 32)
    assert lists and [makespan(problem, st) for st in lists] == sorted(makespan(problem, st) for st in lists)
    for st in lists:
        assert max(problem.grid_schedule(32, st).peak_memory) <= 32  # rules 1 to 4 on the grid
    s = problem.schedule(32, lists[0], None, None, {"base": "grouped-list"})
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    # on the rounded-up grid (its durations never shorter than the real ones): within 0.1% of the
    # peer's 92.832, which the search's own passes then reach (the slow test below)
    assert s.errors() == [] and s.makespan <= 92.832 * 1.001
    assert grouped_lists(problem, 31) == [] and grouped_lists(make_problem(library.build("vshape", devices=4)), 8) == []
    # 30 activations: no warm-up of Megatron's or ZB-H1's fits; a capped one does
    tight = make_problem(p, 30, 32)
    capped = grouped_lists(tight, 32)
    assert capped and all(max(tight.grid_schedule(32, st).peak_memory) <= 30 for st in capped)


@pytest.mark.slow
def test_the_search_alone_meets_interleaved_zero_bubble_at_16_devices(tmp_path: Path) -> None:
    p = library.interleaved_zb(16, **P16)
    s = search(p, 32, 32, time_limit=20, budget=Budget(race=False))
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.errors() == [] and max(s.peak_memory) <= 32 and s.makespan <= 92.832 + 1e-9
