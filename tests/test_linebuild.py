"""The line construction the search alone starts from on line placements (tessel.search.linebuild
and passes/vseed.py): valid, within the limit, at the proven bound under ZB-H1's memory where the
period search's completion is not, only on line placements."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.search import Budget, search
from tessel.search.linebuild import line_chain, line_construction, line_order
from tessel.search.passes.vseed import LINE_BASE


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zb with the zero-bubble repository's profile (F/B/W = 1/0.976/0.504 a stage) and its latency."""
    return library.zb(p, forward=1.0, backward=0.976, weight=0.504, latency=latency)


def built(z: Placement, n: int, limit: float) -> Schedule:
    starts = line_construction(z, n, [limit] * z.devices)
    assert starts is not None
    return Schedule.build(z, n, starts, limit)


@pytest.mark.parametrize("p, n, latency", [(8, 24, 0.032), (16, 32, 0.0)])
def test_search_alone_meets_the_bound_under_zb_h1_memory(tmp_path: Path, p: int, n: int, latency: float) -> None:
    # p activations on every device (ZB-H1's); the period search alone completed 104.968 at p = 16
    z, limit = profiled(p, latency), p
    s = search(z, n, memory=limit, time_limit=10, budget=Budget(race=False))
    assert s.errors() == [] and max(s.peak_memory) <= limit
    assert s.makespan <= s.meta["lower_bound"] + 1e-9, s.meta
    assert s.makespan <= BASELINES["zb-h1"](z, n, limit).makespan + 1e-9
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")


@pytest.mark.parametrize("limit", [3, 5, 8])
def test_construction_fits_a_tighter_limit_with_shallower_warm_ups(limit: int) -> None:
    z, n = profiled(8), 16
    s = built(z, n, limit)
    assert s.errors() == [] and max(s.peak_memory) <= limit
    first_b = min(t.start for t in s.tasks if t.block.startswith("b") and 0 in z.by_id[t.block].devices)
    forwards = sum(1 for t in s.tasks if t.block == "f0" and t.start < first_b)
    assert forwards == min(limit, 8)  # 1F1B's warm-up on device 0 (8 of 8), as deep as a tighter limit holds


def test_order_is_1f1b_with_each_w_after_its_b() -> None:
    c = line_chain(profiled(4))
    assert c is not None
    order = line_order(c, 4, 1, 6, 3)  # device 1 of 4: 1F1B's warm-up of 3
    assert order[:6] == [("f1", 0), ("f1", 1), ("f1", 2), ("b2", 0), ("w2", 0), ("f1", 3)]
    assert sorted(order) == sorted((b, m) for b in ("f1", "b2", "w2") for m in range(6))


def test_only_on_lines() -> None:
    assert line_chain(library.zb(4)) is not None
    assert line_chain(library.zbv(4)) is None and line_chain(library.interleaved_zb(4)) is None
    assert line_construction(library.zbv(4), 8, None) is None
    z = profiled(4)
    assert line_construction(z, 8, [4] * 4) == line_construction(z, 8, [4] * 4)


def test_search_offers_it_raced_or_not() -> None:
    z, n, limit = profiled(4), 12, 4
    s = search(z, n, memory=limit, time_limit=3, budget=Budget(race=False))
    assert s.meta["statuses"].get(LINE_BASE.replace(" ", "_")) == pytest.approx(built(z, n, limit).makespan)
    assert s.makespan <= built(z, n, limit).makespan + 1e-9
    raced = search(z, n, memory=limit, time_limit=3)  # the default: offered too, so never longer than it
    assert raced.meta["statuses"].get(LINE_BASE.replace(" ", "_")) == pytest.approx(built(z, n, limit).makespan)
    assert raced.makespan <= built(z, n, limit).makespan + 1e-9
