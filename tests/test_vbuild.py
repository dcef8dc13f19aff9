"""The V construction the search alone starts from on V placements (tessel.search.vbuild and
passes/vseed.py): valid, within the limit, shorter than 1F1B, only on V placements and only when
the baselines are not raced."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.passes.start import start
from tessel.search.passes.vseed import BASE, vbuild_seed
from tessel.search.problem import make_problem
from tessel.search.state import State
from tessel.search.vbuild import v_chain, v_construction, v_order


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def built(z: Placement, n: int, limit: float) -> Schedule:
    starts = v_construction(z, n, [limit] * z.devices)
    assert starts is not None
    return Schedule.build(z, n, starts, limit)


@pytest.mark.parametrize("p, n, latency", [(4, 8, 0.032), (4, 12, 0.0), (6, 12, 0.032)])
def test_construction_is_valid_fits_and_beats_1f1b(tmp_path: Path, p: int, n: int, latency: float) -> None:
    z = profiled(p, latency)
    one_f_one_b = BASELINES["1f1b"](z, n, None)
    limit = max(one_f_one_b.peak_memory)  # 1F1B's memory (the peers bench's row)
    s = built(z, n, limit)
    assert s.errors() == [] and max(s.peak_memory) <= limit
    assert s.makespan < one_f_one_b.makespan * 0.97, (s.makespan, one_f_one_b.makespan)
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")


def test_order_is_the_v_down_and_back_up() -> None:
    # device 0 of 4: the 7 chunk-0 forwards down to the turn, then 1F1B, chunk 1's backward first
    c = v_chain(profiled(4))
    assert c is not None
    order = v_order(c, 4, 0, 8, 7, 3, 4)
    assert order[:9] == [("f0", m) for m in range(7)] + [("f7", 0), ("b0", 0)]
    assert sorted(order) == sorted((b, m) for b in ("f0", "f7", "b0", "w0", "b7", "w7") for m in range(8))


def test_same_inputs_same_schedule() -> None:
    z = profiled(4)
    assert v_construction(z, 8, [8] * 4) == v_construction(z, 8, [8] * 4)


def test_nothing_on_other_placements_or_under_a_limit_no_variant_fits() -> None:
    assert v_chain(library.zb(4)) is None and v_chain(library.interleaved_zb(4)) is None
    assert v_construction(library.zb(4), 8, None) is None
    assert v_construction(profiled(4), 8, [3] * 4) is None  # fewer activations than a V's warm-up holds


def state_of(z: Placement, n: int, limit: int, race: bool) -> State:
    state = State(make_problem(z, limit, n), n, Clock(30.0), 1, None, Budget(race=race), "makespan")
    start(state, state.clock)
    return state


def test_pass_seeds_only_when_not_raced_and_answers_either_way() -> None:
    alone = state_of(profiled(4), 8, 8, race=False)
    vbuild_seed(alone, alone.clock)
    assert [s.meta["base"] for s in alone.seeds] == [BASE]
    assert alone.best is not None and alone.best.makespan <= alone.seeds[0].makespan
    raced = state_of(profiled(4), 8, 8, race=True)
    vbuild_seed(raced, raced.clock)
    assert raced.seeds == [] and [s.meta["base"] for s in raced.rivals][-1:] == [BASE]


def test_search_alone_is_at_most_the_construction(tmp_path: Path) -> None:
    z, n, limit = profiled(4), 8, 8
    s = search(z, n, memory=limit, time_limit=3, budget=Budget(race=False))
    assert s.errors() == [] and max(s.peak_memory) <= limit
    assert "vbuild" in s.meta["seconds"], s.meta
    assert s.makespan <= built(z, n, limit).makespan + 1e-9
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
