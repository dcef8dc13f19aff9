"""The squeeze of a V block (tessel.baselines.squeeze) and v-mem with squeezed blocks: each task
as early as its inputs' slots and its device's memory allow; under V-Min's memory with profiled
costs, shorter than the block's own warm-up by 4-8% (p = 8, bench/results/squeeze.md)."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.baselines import BASELINES, vmem
from tessel.baselines.schedules import _v_chain
from tessel.baselines.squeeze import squeeze_orders
from tessel.baselines.vmem import GRID, SQUEEZED, Gaps, block_slots, vmem_orders
from tessel.baselines.wfill import fill_weights
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.timing import earliest_starts, order_peak, span

V_MIN_P8 = [7] + [8] * 7  # V-Min's own per-device peak on zbv p = 8, m = 16 (bench/vpeers.py)


def profiled(p: int, latency: float = 0.0) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage)."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def _squeezed(z: Placement, n: int, g: Gaps, limit: list[int] | None,
              slotted: bool = False) -> list[list[tuple[str, int]]]:
    c = _v_chain(z, "v-mem")
    rank = {b: i for i, b in enumerate(list(c.forward) + list(c.backward))}
    return squeeze_orders(z, c, n, block_slots(c, g), rank, vmem.INTERVAL, limit, weights_slotted=slotted)


def test_squeezed_orders_fit_the_limit_and_time_without_deadlock() -> None:
    z, n = profiled(8, 0.032), 16
    checked = 0
    for g in GRID[::9]:
        orders = _squeezed(z, n, g, V_MIN_P8)
        if any(order_peak(z, o) > cap for o, cap in zip(orders, V_MIN_P8)):
            # only a block whose steady state is over the limit stays over (v-mem drops it)
            assert vmem_orders(z, _v_chain(z, "v-mem"), n, g, V_MIN_P8) is None
            continue
        s = Schedule.build(z, n, earliest_starts(z, n, orders), check=False)
        assert s.errors() == [] and all(a <= b for a, b in zip(s.peak_memory, V_MIN_P8)), (g, s.errors()[:1])
        checked += 1
    assert checked >= 3


def test_the_squeeze_moves_tasks_only_earlier_and_fills_the_warm_up() -> None:
    # without a limit every forward runs down the V as soon as its input does: device 0 starts
    # chunk 0's forwards back to back until micro-batch 0 comes back up the V (slot 2p - 1),
    # where the block alone runs one every INTERVAL slots
    z, n = profiled(4), 8
    g = Gaps(1, 1, 1, 1, 1, 1)
    free = _squeezed(z, n, g, None)
    assert free[0][:8] == [("f0", m) for m in range(7)] + [("f7", 0)]
    tight = _squeezed(z, n, g, [4] * 4)
    assert max(order_peak(z, o) for o in tight) <= 4 < max(order_peak(z, o) for o in free)


def test_v_mem_under_v_min_memory_is_shorter_with_squeezed_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # p = 8, m = 16, profiled costs, V-Min's own memory: 60.916 with the block's warm-up alone
    # (V-Min: 60.904), 57.392 with squeezed blocks raced
    z, n = profiled(8), 16
    squeezed = BASELINES["v-mem"](z, n, V_MIN_P8)
    assert squeezed.errors() == [] and all(a <= b for a, b in zip(squeezed.peak_memory, V_MIN_P8))
    monkeypatch.setattr(vmem, "SQUEEZED", ())
    plain = BASELINES["v-mem"](z, n, V_MIN_P8)
    assert plain.errors() == []
    assert squeezed.makespan < 0.97 * plain.makespan, (squeezed.makespan, plain.makespan)
    assert SQUEEZED and all(g.squeeze for g in SQUEEZED)


def test_a_walk_without_reorder_runs_the_orders_as_given() -> None:
    # `reorder=False` (vmem.Fill): the F/B orders are the device's, only the W passes are placed
    z, n = profiled(6, 0.032), 12
    c = _v_chain(z, "v-mem")
    late = set(c.weight.values())
    orders = _squeezed(z, n, Gaps(1, 1, 1, 1, 1, 1), [6] * 6)
    fb = [[x for x in o if x[0] not in late] for o in orders]
    starts = fill_weights(z, fb, c.weight, [6] * 6, reorder=False)
    assert starts is not None
    s = Schedule.build(z, n, starts, check=False)
    assert s.errors() == [] and max(s.peak_memory) <= 6
    for d, o in enumerate(fb):
        ran = sorted((k for k in starts if z.by_id[k[0]].devices[0] == d and k[0] not in late), key=starts.__getitem__)
        assert ran == o
    assert span(z, starts) > 0


def test_slotted_weights_squeeze_fits_and_beats_v_min_at_16_devices() -> None:
    # zbv p = 16, m = 32, profiled costs, V-Min's own memory (12 a device): V-Min 124.508 (the
    # zero-bubble repository's zbv_greedy, timed by bench/vpeers.py); the squeeze with W passes in
    # slots of their own gives 124.204, the W-right-after-B squeeze 125.72 at best
    z, n, lim = profiled(16), 32, [12] * 16
    slotted = _squeezed(z, n, Gaps(1, 1, 2, 1, 1, 1), lim, slotted=True)
    assert all(order_peak(z, o) <= 12 for o in slotted)
    s = BASELINES["v-mem"](z, n, lim)
    assert s.errors() == [] and max(s.peak_memory) <= 12
    assert s.makespan < 124.508, s.makespan
