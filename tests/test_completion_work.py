"""The completion's budget is deterministic work (issue 17): its solves do at most the work the
search's limit gives them, whatever the machine's load, so two runs with a generous limit give the
same schedule bytes; and the search on its own (no baseline raced) holds its own against the
hand-made ZB-V on a zbv placement with real costs, latency and a memory limit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.completion import complete, makespan, plain_unroll
from tessel.search.problem import make_problem
from tessel.search.repetend import find_repetend

TIMING = ("search_seconds", "seconds")  # the meta fields that say how long it took


def profiled() -> Placement:
    """zbv-4 with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)


def without_timing(s: Schedule) -> str:
    d = s.to_dict()
    for key in TIMING:
        d["meta"].pop(key, None)
    return json.dumps(d, sort_keys=True)


def test_completion_work_follows_the_limit_not_the_time_left() -> None:
    b = Budget()
    assert b.completion_work(10.0) == pytest.approx(10.0 * b.completion_share / b.work_wall)
    assert b.completion_work(20.0) == pytest.approx(2 * b.completion_work(10.0))
    assert Budget(prove=True).completion_work(10.0) == float("inf")


def test_completion_solves_stay_within_their_work() -> None:
    p = make_problem(profiled(), 8, 8)
    mod = find_repetend(p, Clock(30.0)).modulo
    starts = plain_unroll(mod, 8)
    stall = Budget().completion_stall(6, len(p.block_ids))
    none = complete(p, starts, 8, [3, 6], Clock(30.0), 1, stall, 0, None, work=0.0)
    assert none.statuses == () and none.work == 0.0  # no work: the compaction alone
    little = complete(p, starts, 8, [3, 6], Clock(30.0), 1, stall, 0, None, work=0.05)
    assert little.statuses and little.work <= 0.05 + 0.02, little  # CP-SAT overruns its limit by a hair
    assert makespan(p, little.starts) <= makespan(p, none.starts)


@pytest.mark.slow
def test_two_runs_give_the_same_bytes_and_beat_zb_v_by_hand(tmp_path: Path) -> None:
    # zbv-4, profiled costs and latency, ZB-V's memory (8 chunk activations), 4 micro-batches, the
    # search alone: every solve ends on its work, none on the (generous) clock
    z, runs = profiled(), []
    for _ in range(2):
        s = search(z, 4, memory=8, time_limit=60, budget=Budget(race=False))
        assert s.errors() == [] and max(s.peak_memory) <= 8
        runs.append(s)
    assert without_timing(runs[0]) == without_timing(runs[1])
    hand = BASELINES["zb-v-hand"](z, 4, 8)
    assert runs[0].makespan <= hand.makespan * 1.01, (runs[0].makespan, hand.makespan)  # 11.784 vs 13.232
    runs[0].save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
