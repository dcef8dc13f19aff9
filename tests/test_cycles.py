"""The memory cycle (holds.memory_cycles, in the staggered releases of bounds.device_lower_bound):
what a device runs before the memory that a later forward needs comes back, one machine for the
releases, what they wait for there and the allocation's own predecessors there. Proven below the
exact optimum on the random placements of the other bounds' tests, and higher than the bound
without it on some."""
from __future__ import annotations

import pytest
from test_bounds import _solved, _tiny, _tiny_v

from tessel import bounds, holds, library
from tessel.search.problem import make_problem


def _without_cycles(p: object, n: int, memory: bounds.Memory, monkeypatch: pytest.MonkeyPatch) -> float:
    with monkeypatch.context() as m:
        m.setattr(bounds, "memory_cycles", lambda *_: {})
        return float(bounds.device_lower_bound(p, n, memory))  # type: ignore[arg-type]


def test_the_tip_of_a_v_runs_a_backward_both_weights_and_a_forward_before_its_memory_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/results/peers-v.md's zbv row p = 4, m = 16, unit costs (chunks 0.5), latency 0.5, V-Min's
    # memory (4 chunk activations a device). The tip (device 3) holds two chunks per micro-batch
    # from f3 to w4 and from f4 to w3, so f4 of micro-batch k needs both chunks of k - 2 back. From
    # f4 of k - 2 (at s): the round trip (3 devices and back, 3.0 of work and 6 latencies of 0.5)
    # brings b3 back at s + 6.5; then b3, b4, w3 and w4 run one after another on the tip, so both
    # weight gradients end by s + 8.5 at the earliest, where their least ends one at a time say s + 8
    v = library.zbv(4, forward=0.5, backward=0.5, weight=0.5, latency=0.5)
    memory = make_problem(v, 4).real_holds()
    assert list(bounds.staggered_releases(v, 16, memory)["f4"][-3::2]) == [58, 66.5]
    with monkeypatch.context() as m:
        m.setattr(bounds, "memory_cycles", lambda *_: {})
        assert list(bounds.staggered_releases(v, 16, memory)["f4"][-3::2]) == [55.5, 63.5]
    assert bounds.device_lower_bound(v, 16, memory) == 77.5  # 81 is the best known schedule
    assert _without_cycles(v, 16, memory, monkeypatch) == 74.5


def test_the_splits_of_two_releases_are_every_least_pair() -> None:
    # 3 units to give back, 1 per task of each release, at most 2 and 3 tasks ended
    assert holds._splits(3, [1, 1], [2, 3]) == [(0, 3), (1, 2), (2, 1)]
    assert holds._splits(3, [1, 1, 1], [1, 1, 1]) == [(1, 1, 1)]
    assert holds._splits(4, [1, 1], [1, 2]) == []  # nothing gives 4 back


@pytest.mark.slow
def test_the_memory_cycle_is_below_the_exact_optimum_on_random_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    proven, higher = 0, 0
    cases = [*_solved(_tiny, range(40)), *_solved(_tiny_v, range(60))]
    for seed, p, n, limit, opt, _, new in cases:
        if limit is None:
            continue
        memory = make_problem(p, limit).real_holds()
        plain = _without_cycles(p, n, memory, monkeypatch)
        assert plain <= new <= opt + 1e-9, (seed, p.name, opt, plain, new)
        proven += 1
        higher += new > plain + 1e-9
    assert proven >= 60 and higher >= 5, (proven, higher)
