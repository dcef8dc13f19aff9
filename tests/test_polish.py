"""The order polish (tessel.search.polish): never longer, always valid, memory kept, and shorter
where a schedule leaves a ready task waiting behind an idle gap."""
from __future__ import annotations

import itertools
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_baselines import dags

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.search.polish import polish
from tessel.timing import orders_of, schedule_from_orders


def test_scrambled_micro_batches_come_back_to_gpipe() -> None:
    # GPipe's orders with device 0's forwards in reverse micro-batch order: device 1 waits for the
    # last of them before it starts; in increasing order it is GPipe again, (n + p - 1)(F + B)
    p, n = library.vshape(3), 6
    orders = orders_of(BASELINES["gpipe"](p, n, None))
    fwd = [k for k in orders[0] if k[0] == "f0"]
    back = iter(reversed(fwd))
    orders[0] = [next(back) if k[0] == "f0" else k for k in orders[0]]
    scrambled = schedule_from_orders(p, n, orders)
    assert scrambled.makespan > (n + 2) * 4
    s = polish(scrambled)
    assert s.errors() == [] and s.makespan == (n + 2) * 4
    assert s.peak_memory == scrambled.peak_memory


def test_a_ready_forward_fills_the_gap_when_memory_allows() -> None:
    # two stages, F = B = 1, one micro-batch at a time: device 0 idles over [1, 3) while its next
    # forward is ready; run there it makes 1F1B, (n + p - 1)(F + B) = 6, not 4 (F + B) = 8; under a
    # limit of one activation on device 0 the move is refused and nothing changes
    p, n = library.vshape(2, forward=1, backward=1), 2
    orders = [[("f0", 0), ("b1", 0), ("f0", 1), ("b1", 1)], [("f1", 0), ("b0", 0), ("f1", 1), ("b0", 1)]]
    one_at_a_time = schedule_from_orders(p, n, orders)
    assert one_at_a_time.makespan == 8
    s = polish(one_at_a_time)
    assert s.errors() == [] and s.makespan == 6 and s.peak_memory == (2, 1)
    tight = schedule_from_orders(p, n, orders, memory_limit=[1, 1])
    assert polish(tight) is tight


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=dags(), n=st.integers(1, 5))
def test_polish_never_lengthens_nor_breaks_a_greedy_schedule(p: Placement, n: int) -> None:
    s = BASELINES["greedy"](p, n, None)
    limit = [max(x, 0) for x in s.peak_memory]
    s = Schedule.build(p, n, s.start, limit)
    out = polish(s)
    assert out.errors() == [] and out.makespan <= s.makespan
    assert all(a <= b for a, b in zip(out.peak_memory, limit))


def test_a_schedule_without_gaps_is_returned_as_it_is() -> None:
    s = BASELINES["gpipe"](library.vshape(1), 4, None)
    assert polish(s) is s


def _one_f_one_b() -> Schedule:
    # 1F1B on a 4-device X shape leaves gaps the walk fills over a few hundred replays
    return BASELINES["1f1b"](library.xshape(4), 12, None)


def test_the_walk_is_budgeted_in_work_so_a_loaded_machine_gives_the_same_schedule() -> None:
    s = _one_f_one_b()
    work = 300 * 12 * len(s.placement.blocks)  # 300 replays: the budget, not convergence, ends the walk
    quiet = polish(s, work)
    assert quiet.errors() == [] and quiet.makespan < s.makespan
    assert quiet.to_dict() != polish(s).to_dict()  # the budget bound it
    stop = threading.Event()

    def busy() -> None:  # a competing thread: every replay takes longer in wall time
        while not stop.is_set():
            sum(range(10_000))

    t = threading.Thread(target=busy)
    t.start()
    try:
        loaded = polish(s, work)
    finally:
        stop.set()
        t.join()
    assert loaded.to_dict() == quiet.to_dict()
    ticks = itertools.count()  # a clock on which every call takes a second, far from the deadline
    assert polish(s, work, deadline=1e12, now=lambda: float(next(ticks))).to_dict() == quiet.to_dict()


def test_the_deadline_is_only_a_safety_net() -> None:
    s = _one_f_one_b()
    assert polish(s, deadline=0.0, now=lambda: 1.0) is s  # past the search's time limit: nothing done
    assert polish(s, stall=0) is s  # no replay allowed


def test_weight_passes_held_up_behind_their_b_move_into_the_cool_down() -> None:
    # ZB-V's hand-made orders on the V with every W run right after its B: each W then delays the
    # next B of the cool-down, 40 against 38; the walk defers them (a W's end weighs little in the
    # tie-break, so a B earlier is worth it) and gets ZB-V's makespan back within ZB-V's memory
    z, n = library.zbv(3, forward=1, backward=1, weight=1), 6
    hand = BASELINES["zb-v-hand"](z, n, None)
    at_once = []
    for order in orders_of(hand):
        run: list[tuple[str, int]] = []
        for b, m in (k for k in order if k[0] not in ("w0", "w1", "w2", "w3", "w4", "w5")):
            run += [(b, m), ("w" + b[1:], m)] if b.startswith("b") else [(b, m)]
        at_once.append(run)
    s = schedule_from_orders(z, n, at_once, memory_limit=list(hand.peak_memory))
    assert s.makespan == 40 and hand.makespan == 38
    out = polish(s)
    assert out.errors() == [] and out.makespan == 38
    assert all(a <= b for a, b in zip(out.peak_memory, hand.peak_memory))
