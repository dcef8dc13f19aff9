"""The W-filling walk's forward wait (tessel.baselines.wfill, `wait`) and v-mem with it: with
latency, a device waits a little for the forward nearer the loss instead of starting one more
chunk-0 forward, so micro-batch 0's trip back up the V is not held (V-Half's memory, p = 6)."""
from __future__ import annotations

from tessel import library
from tessel.baselines import BASELINES
from tessel.baselines.schedules import _v_chain
from tessel.baselines.vmem import GRID, vmem_orders
from tessel.baselines.wfill import fill_weights
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.timing import span


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def test_v_mem_under_v_half_memory_with_latency_is_shorter_with_the_wait() -> None:
    # before the wait: 38.612 (and V-Half's own order 38.024)
    z, n, lim = profiled(6), 12, 8
    s = BASELINES["v-mem"](z, n, lim)
    assert s.errors() == [] and max(s.peak_memory) <= lim
    assert s.makespan < 38.2, s.makespan


def test_the_wait_keeps_the_limit_and_the_dependencies() -> None:
    z, n, lim = profiled(4), 8, 6
    c = _v_chain(z, "v-mem")
    late = set(c.weight.values())
    timed = 0
    for g in GRID[::7]:
        orders = vmem_orders(z, c, n, g, [lim] * 4)
        if orders is None:
            continue
        fb = [[x for x in o if x[0] not in late] for o in orders]
        for wait in (0.2, 1.0):
            starts = fill_weights(z, fb, c.weight, [lim] * 4, wait=wait)
            assert starts is not None
            s = Schedule.build(z, n, starts, check=False)
            assert s.errors() == [] and max(s.peak_memory) <= lim, (g, wait, s.errors()[:1])
            timed += 1
    assert timed >= 4


def test_no_wait_is_the_walk_as_before() -> None:
    z, n = profiled(4), 8
    c = _v_chain(z, "v-mem")
    late = set(c.weight.values())
    orders = vmem_orders(z, c, n, GRID[0], None)
    assert orders is not None
    fb = [[x for x in o if x[0] not in late] for o in orders]
    plain = fill_weights(z, fb, c.weight, None)
    assert plain is not None and plain == fill_weights(z, fb, c.weight, None, wait=0.0)
    assert span(z, plain) > 0
