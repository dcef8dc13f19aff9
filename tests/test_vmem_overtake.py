"""The W-filling walk's memory-safe overtaking and urgent forwards (tessel.baselines.wfill:
`overtake`, `urgent`) and v-mem with them (tessel.baselines.vmem.FILLS), under the zero-bubble
repository's V-Half and V-Min memory (8 and 6 chunk activations at p = 6)."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.baselines import BASELINES
from tessel.baselines.schedules import _v_chain
from tessel.baselines.vmem import GRID, Gaps, vmem_orders
from tessel.baselines.wfill import fill_weights
from tessel.placement import Placement
from tessel.schedule import Schedule


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage)."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def timed(z: Placement, n: int, g: Gaps, lim: int, **walk: object) -> Schedule | None:
    """Block g's orders under `lim` timed by the walk, checked by the four rules (or None: the
    block does not fit)."""
    c = _v_chain(z, "v-mem")
    orders = vmem_orders(z, c, n, g, [lim] * z.devices)
    if orders is None:
        return None
    late = set(c.weight.values())
    starts = fill_weights(z, [[x for x in o if x[0] not in late] for o in orders], c.weight,
                          [lim] * z.devices, **walk)  # type: ignore[arg-type]
    assert starts is not None
    s = Schedule.build(z, n, starts, check=False)
    assert s.errors() == [], (g, walk, s.errors()[:1])
    return s


def test_overtaking_keeps_the_limit_where_the_device_is_at_it() -> None:
    # this block at p = 6, m = 24 overtakes with the device one activation below its limit and a
    # W owed: counted as run, the forward went over by one (peak 9 under a limit of 8)
    z, lim = profiled(6), 8
    s = timed(z, 24, Gaps(2, 2, 2, 2, 2, 2), lim, slack=0.0, overtake=True)
    assert s is not None and max(s.peak_memory) <= lim
    plain = timed(z, 24, Gaps(2, 2, 2, 2, 2, 2), lim, slack=0.0)
    assert plain is not None and s.start != plain.start  # it did overtake


@pytest.mark.parametrize("lim, latency", [(6, 0.0), (8, 0.032)])
def test_overtaking_and_urgent_walks_keep_the_limit_on_the_grid(lim: int, latency: float) -> None:
    z, n = profiled(4, latency), 8
    timings = 0
    for g in GRID[::5]:
        for walk in (dict(slack=0.5, overtake=True), dict(slack=0.8, wait=0.2, urgent=("f4", "f5", "f6", "f7"))):
            s = timed(z, n, g, lim, **walk)
            if s is not None:
                assert max(s.peak_memory) <= lim, (g, walk, s.peak_memory)
                timings += 1
    assert timings >= 8


def test_no_overtaking_nor_urgent_is_the_walk_as_before() -> None:
    z = profiled(4)
    s0 = timed(z, 8, GRID[3], 6)
    s1 = timed(z, 8, GRID[3], 6, overtake=False, urgent=())
    assert s0 is not None and s1 is not None and s0.start == s1.start


def test_v_mem_under_v_min_memory_without_latency_overtakes() -> None:
    # p = 6, m = 12, V-Min's memory (6), no latency: 43.940 before the overtaking, V-Min 43.988
    z, n, lim = profiled(6, 0.0), 12, 6
    s = BASELINES["v-mem"](z, n, lim)
    assert s.errors() == [] and max(s.peak_memory) <= lim
    assert s.makespan < 43.6, s.makespan


def test_v_mem_under_v_half_memory_with_latency_keeps_chunk_1_forwards_urgent() -> None:
    # p = 6, m = 24, V-Half's memory (8), latency 0.032: 68.684 before, V-Half's own 67.784
    z, n, lim = profiled(6), 24, 8
    s = BASELINES["v-mem"](z, n, lim)
    assert s.errors() == [] and max(s.peak_memory) <= lim
    assert s.makespan < 68.0, s.makespan
