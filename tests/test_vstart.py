"""The v-mem construction as the search's own start on V placements under a tight memory limit
(tessel.search.passes.vstart): used with no baseline raced, valid, never where v-mem is futile."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import Placement
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.passes.start import start
from tessel.search.passes.vstart import BASE, vmem_start
from tessel.search.problem import make_problem
from tessel.search.state import State


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def started(z: Placement, n: int, limit: int, race: bool = False) -> State:
    """A search's state after its start pass (by default no baseline raced)."""
    state = State(make_problem(z, limit, n), n, Clock(30.0), 1, None, Budget(race=race), "makespan")
    start(state, state.clock)
    return state


@pytest.mark.slow
def test_search_alone_under_v_half_memory_is_as_short_as_v_mem(tmp_path: Path) -> None:
    # p = 4, V-Half's memory (6 chunk activations), no latency: before the pass the search alone
    # completed its own repetend 1.5-3% above v-mem; now v-mem's schedule is its seed
    z, n, lim = profiled(4, latency=0), 12, 6
    s = search(z, n, memory=lim, time_limit=10, budget=Budget(race=False))
    assert s.errors() == [] and max(s.peak_memory) <= lim
    assert "vmem_start" in s.meta["seconds"], s.meta
    construction = BASELINES["v-mem"](z, n, lim)
    assert s.makespan <= construction.makespan + 1e-9, (s.makespan, construction.makespan, s.meta)
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")


def test_the_seed_is_valid_and_fits_the_limit() -> None:
    state = started(profiled(4), 8, 5)
    vmem_start(state, state.clock)
    assert [s.meta["base"] for s in state.seeds] == [BASE]
    seed = state.seeds[0]
    assert seed.errors() == [] and max(seed.peak_memory) <= 5 and seed.micro_batches == 8


def test_nothing_where_v_mem_is_futile_or_raced() -> None:
    # 1F1B's memory (2p chunks): ZB-V's hand order fits, v-mem is never built
    state = started(profiled(4), 8, 8)
    before = state.start
    vmem_start(state, state.clock)
    assert state.seeds == [] and state.start is before
    # the baselines raced: v-mem is one of them, no second build
    state = started(profiled(4), 8, 5, race=True)
    vmem_start(state, state.clock)
    assert state.seeds == []


def test_not_on_other_placements() -> None:
    state = started(library.zb(4, forward=1, backward=1, weight=1), 8, 4)
    vmem_start(state, state.clock)
    assert state.seeds == []
