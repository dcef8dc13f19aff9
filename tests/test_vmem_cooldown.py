"""v-mem's walks (vmem.FILLS): the first keeps every W from lengthening a wait before a backward
(`back`: in the cool-down the backwards are the chain the last micro-batches' gradients run down
and back up the V, and a W let into each wait on it adds up), and the first two keep a device
from running a later task before a forward due soon (`hold`); V-Half's memory, p = 6, 8, 16."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.baselines import run_baseline
from tessel.baselines.schedules import _v_chain
from tessel.baselines.vmem import GRID, vmem_orders
from tessel.baselines.wfill import fill_weights
from tessel.key import Key
from tessel.placement import Number, Placement
from tessel.schedule import EPS, Schedule


def profiled(p: int, latency: float = 0.032) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def _held_backwards(z: Placement, s: Schedule, backward: set[str], weight: set[str]) -> list[Key]:
    """The backwards right behind a W on their device that still ran when their input was
    ready (the W lengthened the backward's wait)."""
    end: dict[Key, Number] = {k: t + z.by_id[k[0]].duration for k, t in s.start.items()}
    held = []
    for d in range(z.devices):
        mine = sorted((k for k in s.start if z.by_id[k[0]].devices[0] == d), key=lambda k: s.start[k])
        for prev, (b, m) in zip(mine, mine[1:]):
            if b in backward and prev[0] in weight:
                ready = max(end[(a, m)] + z.edge_latency(a, b) for a in z.preds[b])
                if end[prev] > ready + EPS:
                    held.append((b, m))
    return held


def test_with_back_no_w_holds_a_backward() -> None:
    # the orders run as given (no task moves up, so the W's next task is the one it waits
    # before), every 9th block of the grid, V-Half's memory at p = 6
    z, n, lim = profiled(6), 12, [8] * 6
    c = _v_chain(z, "v-mem")
    weight, chunk1 = set(c.weight.values()), tuple(c.forward[len(c.forward) // 2:])
    held = {True: 0, False: 0}
    for g in GRID[::9]:
        orders = vmem_orders(z, c, n, g, lim)
        if orders is None:
            continue
        fb = [[x for x in o if x[0] not in weight] for o in orders]
        for back in (True, False):
            starts = fill_weights(z, fb, c.weight, lim, reorder=False, slack=0.8,
                                  urgent=chunk1 + (tuple(c.backward) if back else ()))
            assert starts is not None
            s = Schedule.build(z, n, starts, lim)  # valid: every rule, the limit on every device
            held[back] += len(_held_backwards(z, s, set(c.backward), weight))
    assert held[True] == 0
    assert held[False] > 0  # the plain slack lets W passes hold backwards back: what `back` is for


@pytest.mark.parametrize("p, n, peer", [(6, 12, 38.024), (8, 16, 51.864)])
def test_v_mem_under_v_half_memory_with_latency_is_shorter_than_v_half(p: int, n: int, peer: float) -> None:
    # the zero-bubble repository's V-Half on these rows (bench/vpeers.py); v-mem before `back`:
    # 38.192 and 52.108, with it 37.848 and 51.600
    lim = 8 if p == 6 else 10
    s = run_baseline("v-mem", profiled(p), n, lim, repetend=False)
    assert s.errors() == [] and max(s.peak_memory) <= lim
    assert s.makespan < peer, s.makespan


def test_hold_keeps_the_limit_and_the_dependencies() -> None:
    # `hold` only makes a device wait for its next forward: every block of a sample of the
    # grid still times to a valid schedule within the limit (no deadlock: the walk returns)
    z, n, lim = profiled(6), 12, [8] * 6
    c = _v_chain(z, "v-mem")
    weight = set(c.weight.values())
    timed = 0
    for g in GRID[::7]:
        orders = vmem_orders(z, c, n, g, lim)
        if orders is None:
            continue
        fb = [[x for x in o if x[0] not in weight] for o in orders]
        for wait in (0.5, 1.0):
            starts = fill_weights(z, fb, c.weight, lim, slack=0.5, wait=wait, hold=True)
            assert starts is not None
            s = Schedule.build(z, n, starts, lim)
            assert s.errors() == [] and max(s.peak_memory) <= 8
            timed += 1
    assert timed >= 4


def test_v_mem_holds_for_a_forward_due_soon() -> None:
    # p = 8, V-Half's memory (10), no latency: 50.328 before `hold` (V-Half: 50.364)
    s = run_baseline("v-mem", profiled(8, latency=0.0), 16, 10, repetend=False)
    assert s.errors() == [] and max(s.peak_memory) <= 10
    assert s.makespan < 50.3, s.makespan


@pytest.mark.slow
def test_v_mem_under_v_half_memory_with_latency_at_p16_is_shorter_than_v_half() -> None:
    # 107.712 before `hold`; V-Half 107.272 (bench/results/peers-v-p16-tight.md)
    s = run_baseline("v-mem", profiled(16), 32, 18, repetend=False)
    assert s.errors() == [] and max(s.peak_memory) <= 18
    assert s.makespan < 107.272, s.makespan
