"""Mode fast's justification: the whole schedule list scheduled backward then forward."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import bounds, library
from tessel.baselines.engine import list_schedule
from tessel.schedule import Schedule
from tessel.search import Budget, search
from tessel.search.completion import compact, makespan, plain_unroll
from tessel.search.fast import constructions, starting_repetend
from tessel.search.justify import _pools, _Walk, justified, listed_repetend, reversed_placement
from tessel.search.modulo import fits
from tessel.search.problem import Problem, make_problem


def unrolled(p: Problem, n: int) -> dict[tuple[str, int], int]:
    """The starting point fast had before justification: its repetend unrolled and compacted."""
    return compact(p, n, plain_unroll(starting_repetend(p), n))


def checked(s: Schedule, tmp_path: Path) -> Schedule:
    assert s.errors() == []
    f = tmp_path / "s.json"
    s.save(f)
    verdict = checker_verdict(f)
    assert verdict is None or verdict["makespan"] == pytest.approx(s.makespan)
    return s


@pytest.mark.parametrize("name", ["zb", "xshape", "zbv"])
def test_justification_packs_the_ramps_of_8_devices_near_the_bound(name: str, tmp_path: Path) -> None:
    # the unrolled repetend idles through warm-up and cool-down (zb 149, xshape 409, zbv 220
    # against bounds 135, 268, 199); both walks keep the limit
    p, n = make_problem(library.build(name, devices=8), 16, 32), 32
    start = unrolled(p, n)
    new = justified(p, n, start, p.lower_bound(n))
    assert new is not None and makespan(p, new) < makespan(p, start)
    assert makespan(p, new) <= 1.01 * p.lower_bound(n)
    s = checked(p.schedule(n, new, None, None, {}), tmp_path)
    assert max(s.peak_memory) <= 16
    assert justified(p, n, start, p.lower_bound(n)) == new  # a fixed work budget: the same every run


def test_the_walk_decides_as_the_engine_does() -> None:
    # one-device blocks get a walk of their own; it must take the engine's decisions
    p, n = make_problem(library.build("zbv", devices=8), 12, 24), 24
    start = unrolled(p, n)
    for placement in (p.units, reversed_placement(p.units)):
        pools = _pools(placement, p, n)
        assert pools is not None and pools.release_early
        rank = {b: i for i, b in enumerate(placement.topo_order)}
        engine = list_schedule(placement, n, lambda b, m, rank=rank: (start[(b, m)], m, rank[b]), pools)
        assert _Walk(placement, n, start, pools).run() == {k: int(v) for k, v in engine.items()}


def test_reversed_placement_reverses_edges_and_memory() -> None:
    p = library.build("zb", devices=4)
    r = reversed_placement(p)
    assert set(r.edges) == {(b, a) for a, b in p.edges}
    assert all(r.by_id[b.id].memory == -b.memory and r.by_id[b.id].devices == b.devices for b in p.blocks)
    assert reversed_placement(r).edges == p.edges


def test_a_limit_below_one_micro_batchs_reservation_is_left_alone() -> None:
    # interleaved's device 0 reserves both chunks (2) before its first one starts: a limit of 1
    # cannot let the walk through, so justification declines instead of deadlocking
    p = make_problem(library.build("interleaved", devices=4), None, 8)
    tight = Problem(p.placement, p.units, (1,) * 4, p.resolution, p.exact_time, p.memory_scale)
    assert justified(tight, 8, compact(p, 8, plain_unroll(starting_repetend(p), 8))) is None


@pytest.mark.slow
def test_fast_at_32_devices_is_within_ten_percent_of_the_bound(tmp_path: Path) -> None:
    # issue 17 item 5: the unrolled repetend was 1.114 above the bound on zb at 32 devices
    p = library.build("zb", devices=32)
    s = checked(search(p, 128, 64, mode="fast", time_limit=60, budget=Budget(race=False)), tmp_path)
    assert s.makespan <= 1.10 * bounds.lower_bound(p, 128)
    assert s.meta["base"] == "justified" and max(s.peak_memory) <= 64


def test_tessel_offers_its_starting_construction_justified_at_any_n(tmp_path: Path) -> None:
    # mode tessel justified only its own repetend's unroll, and only at few micro-batches: on
    # interleaved at 32 devices, N = 128, it stopped at 1245 where fast, from the construction, gives 1232
    from tessel.search.budget import Clock
    from tessel.search.passes.justify import construction
    from tessel.search.state import State
    pl, n = library.build("interleaved", devices=32), 128
    p = make_problem(pl, 64, n)
    state = State(p, n, Clock(60.0), 1, None, Budget(), "makespan")
    state.start = starting_repetend(p)
    construction(state, Clock(60.0))
    assert state.best is not None
    best = checked(state.best, tmp_path)
    assert best.meta["base"] == "justified" and max(best.peak_memory) <= 64
    assert best.makespan < p.real(makespan(p, unrolled(p, n)))  # the walks packed the ramps
    assert best.makespan <= 1.10 * bounds.lower_bound(pl, n)


def test_the_rounds_come_from_the_limit_not_the_clock() -> None:
    # a budget whose share of the limit allows no round leaves the repetend's completion as it was
    p = library.build("zb", devices=8)
    on = search(p, 32, 16, mode="fast", time_limit=60, budget=Budget(race=False))
    off = search(p, 32, 16, mode="fast", time_limit=60, budget=Budget(race=False, justify_share=0.0))
    assert on.errors() == [] and off.errors() == []
    assert on.meta["base"] == "justified" and off.meta["base"] != "justified"
    assert on.makespan == bounds.lower_bound(p, 32) <= off.makespan
    assert Budget().justify_rounds(1.145, 128 * 128) == 3 and Budget().justify_rounds(0.01, 128 * 128) == 0


def zbv_profiled() -> tuple[object, list[int]]:
    """zbv at 4 devices with the zero-bubble repository's profiled costs (a chunk half a stage) and
    latency, and the memory of tessel's own hand-made ZB-V order (zb-v-hand, torch's ZBVZeroBubble's
    order: 8 chunks per device)."""
    from tessel.baselines import BASELINES
    p = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    return p, list(BASELINES["zb-v-hand"](p, 8, None).peak_memory)


def test_a_listed_repetend_reaches_the_load_bound_where_no_construction_fits(tmp_path: Path) -> None:
    # no construction fits memory at the bound, so the period search used to start above it and
    # bisect with solves a loaded machine could not finish (2.55-2.71 per micro-batch, bound 2.48)
    placement, memory = zbv_profiled()
    p = make_problem(placement, memory, 8)  # type: ignore[arg-type]
    assert not any(fits(p, m) for m in constructions(p, p.period_bound))
    start = starting_repetend(p)
    assert start.per_micro_batch > p.period_bound
    mod = listed_repetend(p, start)
    assert mod is not None and mod.per_micro_batch == p.period_bound and fits(p, mod)
    checked(p.schedule(8, plain_unroll(mod, 8), None, None, {}), tmp_path)  # its unroll keeps every rule
    assert listed_repetend(p, start) == mod  # linear walks: the same every run


def test_the_search_alone_on_zbv_with_real_costs_comes_near_zb_v(tmp_path: Path) -> None:
    # the search on its own (no baseline raced) under ZB-V's memory: 22.2-23.9 (up to 9.7% over the
    # hand-made order's 21.79, the period 2.55-2.71) before it justified its schedules and started at
    # the listed repetend; after, 21.9-23.0 at load 6-8 on 2 shared cores (the completion solves
    # that close the rest are cut by the clock there), so the margin is the load's, not the target's
    from tessel.baselines import BASELINES
    placement, memory = zbv_profiled()
    ref = BASELINES["zb-v-hand"](placement, 8, None)  # type: ignore[arg-type]
    s = checked(search(placement, 8, memory=memory, time_limit=5, budget=Budget(race=False)), tmp_path)  # type: ignore[arg-type]
    assert s.meta["period"] == pytest.approx(2.481445)  # the grid's load bound
    assert max(a - b for a, b in zip(s.peak_memory, memory)) <= 1e-9
    assert s.makespan <= 1.06 * ref.makespan
