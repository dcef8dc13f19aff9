"""The shapes pass (search/passes/shapes.py): at the period found, the repetend whose quick
completion is shortest goes on to the completion; and the search alone on a small interleaved
placement with the backward split, fractional costs and latency, against the interleaved baseline."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.fast import constructions
from tessel.search.passes.complete import completed
from tessel.search.passes.shapes import shapes
from tessel.search.problem import make_problem
from tessel.search.repetend import find_repetend
from tessel.search.state import State

# interleaved-zb at 4 devices: a chunk is half a unit stage (F = B = W = 0.5), latency 0.5, under the
# per-device peak of torch's Interleaved1F1B (11, 9, 7, 5), hard-coded so that torch is not needed
MEMORY = [11, 9, 7, 5]


def placement() -> library.Placement:
    return library.interleaved_zb(4, forward=0.5, backward=0.5, weight=0.5, latency=0.5)


@pytest.mark.slow
def test_a_construction_that_completes_shorter_replaces_the_least_span_repetend() -> None:
    pl, n = placement(), 12  # at 8 the quick completion misleads: 33.5 against the least-span one's 33
    p = make_problem(pl, MEMORY, n)
    least = find_repetend(p, Clock(30)).modulo
    assert least.period == 6 and least.copies == 1  # the load bound, 3 (grid of 0.5): proven optimal
    state = State(p, n, Clock(120), 1, None, Budget(), modulo=least)
    state.best = theirs = completed(state, least, Clock(30))
    shapes(state, Clock(60))
    quick = state.statuses["shapes"]  # the least-span repetend's quick completion first
    assert state.modulo is not least and state.modulo in constructions(p, least.period)
    assert min(quick[1:]) < quick[0]
    mine = state.best
    assert mine.errors() == [] and theirs.errors() == [] and mine.meta["base"] == "repetend"
    assert all(x <= limit for x, limit in zip(mine.peak_memory, MEMORY))
    interleaved = BASELINES["interleaved"](pl, n, MEMORY)
    assert mine.makespan < theirs.makespan and mine.makespan <= interleaved.makespan


def test_the_search_alone_comes_within_reach_of_the_interleaved_baseline(tmp_path: Path) -> None:
    pl, n = placement(), 8
    alone = search(pl, n, MEMORY, time_limit=10, budget=Budget(race=False))
    alone.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    interleaved = BASELINES["interleaved"](pl, n, MEMORY)
    assert alone.errors() == [] and alone.meta["base"] not in BASELINES  # its own schedule: nothing raced
    assert alone.makespan <= interleaved.makespan * 1.05
